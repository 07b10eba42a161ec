package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// releaseLock is the transaction-scoped advisory lock that numbers one
// release at a time, so that "is this bundle already the group's
// latest?" and the new number are one decision across replicas.
const releaseLock = schemaLock + 1

// PutBundle implements BundleStore on PostgreSQL, as Store.PutBundle.
func (s *PGStore) PutBundle(ctx context.Context, group string, info BundleInfo, encoded []byte, now time.Time) (rel Release, created bool, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	info.Releases = nil
	doc, err := json.Marshal(info)
	if err != nil {
		return Release{}, false, err
	}
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, releaseLock); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sortie_bundles (hash, info, data) VALUES ($1, $2, $3) ON CONFLICT (hash) DO NOTHING`, info.Hash, doc, encoded); err != nil {
			return err
		}
		var last []byte
		err := tx.QueryRow(ctx, `SELECT doc FROM sortie_releases WHERE grp = $1 ORDER BY version DESC LIMIT 1`, group).Scan(&last)
		switch {
		case err == nil:
			if err := json.Unmarshal(last, &rel); err != nil {
				return fmt.Errorf("decode release: %w", err)
			}
			if rel.Hash == info.Hash {
				return nil
			}
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		rel, err = pgAddRelease(ctx, tx, Release{Group: group, Hash: info.Hash, Kind: ReleasePush, At: now})
		created = true
		return err
	})
	return rel, created, err
}

// AddRelease implements BundleStore on PostgreSQL.
func (s *PGStore) AddRelease(ctx context.Context, r Release) (_ Release, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var one int
		if err := tx.QueryRow(ctx, `SELECT 1 FROM sortie_bundles WHERE hash = $1`, r.Hash).Scan(&one); errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: bundle %s", ErrNotFound, r.Hash)
		} else if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, releaseLock); err != nil {
			return err
		}
		r, err = pgAddRelease(ctx, tx, r)
		return err
	})
	return r, err
}

func pgAddRelease(ctx context.Context, tx pgx.Tx, r Release) (Release, error) {
	var v int64
	if err := tx.QueryRow(ctx, `SELECT nextval('sortie_release_version')`).Scan(&v); err != nil {
		return r, err
	}
	r.Version = uint64(v)
	doc, err := json.Marshal(r)
	if err != nil {
		return r, err
	}
	_, err = tx.Exec(ctx, `INSERT INTO sortie_releases (version, grp, hash, doc) VALUES ($1, $2, $3, $4)`, v, r.Group, r.Hash, doc)
	return r, err
}

// Bundle implements BundleStore on PostgreSQL.
func (s *PGStore) Bundle(ctx context.Context, hash string) (info BundleInfo, enc []byte, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var doc []byte
	err = s.pool.QueryRow(ctx, `SELECT info, data FROM sortie_bundles WHERE hash = $1`, hash).Scan(&doc, &enc)
	if errors.Is(err, pgx.ErrNoRows) {
		return info, nil, fmt.Errorf("%w: bundle %s", ErrNotFound, hash)
	}
	if err != nil {
		return info, nil, err
	}
	if err := json.Unmarshal(doc, &info); err != nil {
		return info, nil, fmt.Errorf("decode bundle info: %w", err)
	}
	info.Releases, err = queryDocs[Release](ctx, s, `SELECT doc FROM sortie_releases WHERE hash = $1 ORDER BY version`, hash)
	return info, enc, err
}

// Releases implements BundleStore on PostgreSQL.
func (s *PGStore) Releases(ctx context.Context, group string) (_ []Release, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return queryDocs[Release](ctx, s, `SELECT doc FROM sortie_releases WHERE $1 = '' OR grp = $1 ORDER BY version DESC`, group)
}

// scanDocs decodes each row's one JSON column.
func scanDocs[T any](rows pgx.Rows) ([]T, error) {
	defer rows.Close()
	var out []T
	for rows.Next() {
		var doc []byte
		if err := rows.Scan(&doc); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal(doc, &v); err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// LoadFleet implements FleetStore on PostgreSQL.
func (s *PGStore) LoadFleet(ctx context.Context) (st FleetState, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if st.Rollouts, err = queryDocs[*Rollout](ctx, s, `SELECT doc FROM sortie_rollouts`); err != nil {
		return FleetState{}, err
	}
	if st.Targets, err = queryDocs[*RolloutGateway](ctx, s, `SELECT doc FROM sortie_targets`); err != nil {
		return FleetState{}, err
	}
	if st.Gateways, err = queryDocs[*FleetGateway](ctx, s, `SELECT doc FROM sortie_fleet`); err != nil {
		return FleetState{}, err
	}
	st.Groups, err = queryDocs[*Group](ctx, s, `SELECT doc FROM sortie_groups`)
	return st, err
}

func queryDocs[T any](ctx context.Context, s *PGStore, q string, args ...any) ([]T, error) {
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	return scanDocs[T](rows)
}

// SaveFleet implements FleetStore on PostgreSQL: one transaction.
func (s *PGStore) SaveFleet(ctx context.Context, c FleetState) (err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var b pgx.Batch
	queue := func(q string, v any, keys ...any) error {
		doc, err := json.Marshal(v)
		if err != nil {
			return err
		}
		b.Queue(q, append(keys, doc)...)
		return nil
	}
	for _, r := range c.Rollouts {
		if err := queue(`INSERT INTO sortie_rollouts (id, doc) VALUES ($1, $2) ON CONFLICT (id) DO UPDATE SET doc = excluded.doc`, r, r.ID); err != nil {
			return err
		}
	}
	for _, t := range c.Targets {
		if err := queue(`INSERT INTO sortie_targets (rollout, gateway, doc) VALUES ($1, $2, $3) ON CONFLICT (rollout, gateway) DO UPDATE SET doc = excluded.doc`, t, t.Rollout, t.Gateway); err != nil {
			return err
		}
	}
	for _, g := range c.Gateways {
		if err := queue(`INSERT INTO sortie_fleet (gateway, doc) VALUES ($1, $2) ON CONFLICT (gateway) DO UPDATE SET doc = excluded.doc`, g, g.Gateway); err != nil {
			return err
		}
	}
	for _, g := range c.Groups {
		if err := queue(`INSERT INTO sortie_groups (name, doc) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET doc = excluded.doc`, g, g.Name); err != nil {
			return err
		}
	}
	if len(c.Forget) > 0 {
		b.Queue(`DELETE FROM sortie_targets WHERE rollout = ANY($1)`, c.Forget)
		b.Queue(`DELETE FROM sortie_rollouts WHERE id = ANY($1)`, c.Forget)
	}
	write := func(tx pgx.Tx) error { return tx.SendBatch(ctx, &b).Close() }
	s.leadMu.Lock()
	defer s.leadMu.Unlock()
	switch {
	case s.lead != nil:
		// On the lock's own session: while the transaction commits, the
		// lock is held, so no other replica drives; a session gone fails it.
		return pgx.BeginFunc(ctx, s.lead, write)
	case s.led:
		return fmt.Errorf("%w: this replica lost the lead; its records are not written", ErrNotLeader)
	}
	return pgx.BeginFunc(ctx, s.pool, write)
}

// leadLock is the session advisory lock held by the replica that drives
// the rollouts: PostgreSQL frees it when that replica's connection ends
// (the process dies, the network cuts it), so another replica takes
// over; no lease of our own.
const leadLock = releaseLock + 1

// Lead tries to become the replica that drives the rollouts. held false:
// another one does. Held, lost is closed when the lock's connection is
// found gone (checked every second), and release gives the lock up.
func (s *PGStore) Lead(ctx context.Context) (held bool, lost <-chan struct{}, release func(), err error) {
	defer unavailable(&err)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, nil, nil, err
	}
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, leadLock).Scan(&held); err != nil || !held {
		conn.Release()
		return false, nil, nil, err
	}
	s.leadMu.Lock()
	s.lead, s.led = conn, true
	s.leadMu.Unlock()
	gone := make(chan struct{})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			s.leadMu.Lock() // a connection serves one caller at a time
			err := conn.Ping(pctx)
			s.leadMu.Unlock()
			cancel()
			if err != nil {
				close(gone)
				return
			}
		}
	}()
	var once sync.Once
	return true, gone, func() {
		once.Do(func() {
			close(stop)
			<-done
			s.leadMu.Lock()
			s.lead = nil
			// Closing the session frees the lock whatever state the
			// connection is in; the pool makes a new one.
			_ = conn.Conn().Close(context.Background())
			conn.Release()
			s.leadMu.Unlock()
		})
	}, nil
}
