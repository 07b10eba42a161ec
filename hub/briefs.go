package hub

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/driver"
)

// The fleet's counts and the gateway list's filters need, of each
// gateway, its presence and whether it has a backlog: a few bytes, where
// its record (heartbeat, device inventory, scenes) is kilobytes to read
// and decode. Both stores keep this brief beside the record, written in
// the same transaction, so that GET /api/fleet/overview and a page of
// GET /api/gateways read 10,000 briefs and the page's 50 records, not
// 10,000 records. "Failed in the last 24 h" is read for the page's
// gateways only, from an index of failed missions by gateway and time.

// GatewayBrief is what the fleet's counts and filters read of a gateway.
type GatewayBrief struct {
	ID      string
	State   string // as Gateway.State
	Backlog int    // the last heartbeat's, 0 without one
}

func briefOf(g *Gateway) GatewayBrief {
	b := GatewayBrief{ID: g.ID, State: g.State}
	if g.Heartbeat != nil {
		b.Backlog = min(max(g.Heartbeat.Backlog, 0), 1<<31-1) // as both stores keep it
	}
	return b
}

var (
	// bucketBriefs: gateway ID -> uvarint backlog + state.
	bucketBriefs = []byte("briefs")
	// bucketFailed: gateway 0x00 finished (8 bytes big-endian ns)
	// mission ID -> nothing, for each mission finished FAILED.
	bucketFailed = []byte("failed")
)

func encodeBrief(b GatewayBrief) []byte {
	v := binary.AppendUvarint(nil, uint64(b.Backlog))
	return append(v, b.State...)
}

func decodeBrief(id, v []byte) (GatewayBrief, error) {
	n, k := binary.Uvarint(v)
	if k <= 0 {
		return GatewayBrief{}, fmt.Errorf("gateway brief %q: bad backlog", id)
	}
	return GatewayBrief{ID: string(id), Backlog: int(min(n, 1<<31-1)), State: string(v[k:])}, nil
}

// putGateway writes a gateway's record and its brief.
func putGateway(tx *bolt.Tx, g *Gateway) error {
	if err := putJSON(tx.Bucket(bucketGateways), []byte(g.ID), g); err != nil {
		return err
	}
	return tx.Bucket(bucketBriefs).Put([]byte(g.ID), encodeBrief(briefOf(g)))
}

// failedKey is a mission's key in bucketFailed; ns is its finished time
// as the finished index keeps it (timeKey's 8 bytes).
func failedKey(gw string, ns []byte, id string) []byte {
	k := make([]byte, 0, len(gw)+9+len(id))
	k = append(k, gw...)
	k = append(k, 0)
	k = append(k, ns...)
	return append(k, id...)
}

// noteFailed keeps bucketFailed up to date with a mission whose outcome
// or finish time changed from (before, old) to m's.
func noteFailed(tx *bolt.Tx, before driver.Summary, old time.Time, m *Mission) error {
	b := tx.Bucket(bucketFailed)
	if before.State == driver.StateFailed && !old.IsZero() {
		if err := b.Delete(failedKey(m.Gateway, timeKey(old, nil), m.ID)); err != nil {
			return err
		}
	}
	if cur := finishedAt(m); m.Summary.State == driver.StateFailed && !cur.IsZero() {
		return b.Put(failedKey(m.Gateway, timeKey(cur, nil), m.ID), nil)
	}
	return nil
}

// backfillBriefs fills the buckets a store made before them lacks: the
// briefs from the gateways' records, the failed index from the finished
// missions. It runs in Open, once, when a file is brought to schema 2.
func backfillBriefs(tx *bolt.Tx) error {
	briefs := tx.Bucket(bucketBriefs)
	err := tx.Bucket(bucketGateways).ForEach(func(k, v []byte) error {
		var g Gateway
		if err := json.Unmarshal(v, &g); err != nil {
			return fmt.Errorf("decode gateway %q: %w", k, err)
		}
		return briefs.Put(k, encodeBrief(briefOf(&g)))
	})
	if err != nil {
		return err
	}
	failed, missions := tx.Bucket(bucketFailed), tx.Bucket(bucketMissions)
	return tx.Bucket(bucketFinished).ForEach(func(fk, _ []byte) error {
		v := missions.Get(fk[8:])
		if v == nil {
			return nil
		}
		var m struct {
			Gateway string `json:"gateway"`
			ID      string `json:"id"`
			Summary struct {
				State driver.State `json:"state"`
			} `json:"summary"`
		}
		if err := json.Unmarshal(v, &m); err != nil {
			return fmt.Errorf("decode mission %q: %w", fk[8:], err)
		}
		if m.Summary.State != driver.StateFailed {
			return nil
		}
		return failed.Put(failedKey(m.Gateway, fk[:8], m.ID), nil)
	})
}

// GatewayBriefs returns every gateway's brief, by ID.
func (s *Store) GatewayBriefs(ctx context.Context) ([]GatewayBrief, error) {
	var out []GatewayBrief
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBriefs).ForEach(func(k, v []byte) error {
			b, err := decodeBrief(k, v)
			out = append(out, b)
			return err
		})
	})
	return out, err
}

// GatewaysByID returns the gateways of ids that are known, in the order
// of ids.
func (s *Store) GatewaysByID(ctx context.Context, ids []string) ([]Gateway, error) {
	out := make([]Gateway, 0, len(ids))
	err := s.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGateways)
		for _, id := range ids {
			v := b.Get([]byte(id))
			if v == nil {
				continue
			}
			var g Gateway
			if err := json.Unmarshal(v, &g); err != nil {
				return fmt.Errorf("decode gateway %q: %w", id, err)
			}
			out = append(out, g)
		}
		return nil
	})
	return out, err
}

// FailedSince counts, for each of gws, the missions that finished
// FAILED at or after since: a seek per gateway in the failed index, so
// its cost is the page's gateways and their failures in the window.
func (s *Store) FailedSince(ctx context.Context, since time.Time, gws []string) (map[string]int, error) {
	out := map[string]int{}
	from := timeKey(since, nil)
	err := s.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketFailed).Cursor()
		for _, gw := range gws {
			p := append([]byte(gw), 0)
			for k, _ := c.Seek(append(bytes.Clone(p), from...)); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
				out[gw]++
			}
		}
		return nil
	})
	return out, err
}

// GatewayBriefs returns every gateway's brief, by ID (bytewise, as the
// bbolt Store's).
func (s *PGStore) GatewayBriefs(ctx context.Context) (_ []GatewayBrief, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT id, state, backlog FROM sortie_gateways WHERE length(doc) > 0 ORDER BY id COLLATE "C"`)
	if err != nil {
		return nil, err
	}
	var out []GatewayBrief
	var b GatewayBrief
	_, err = pgx.ForEachRow(rows, []any{&b.ID, &b.State, &b.Backlog}, func() error {
		out = append(out, b)
		return nil
	})
	return out, err
}

// GatewaysByID returns the gateways of ids that are known, in the order
// of ids.
func (s *PGStore) GatewaysByID(ctx context.Context, ids []string) (_ []Gateway, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT doc FROM sortie_gateways WHERE id = ANY($1::text[]) AND length(doc) > 0`, ids)
	if err != nil {
		return nil, err
	}
	got, err := pgx.CollectRows(rows, jsonDoc[Gateway]("gateway"))
	if err != nil {
		return nil, err
	}
	at := make(map[string]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	slices.SortFunc(got, func(x, y Gateway) int { return at[x.ID] - at[y.ID] })
	return got, nil
}

// FailedSince counts, for each of gws, the missions that finished
// FAILED at or after since, from the partial index of failed missions
// by gateway and time (schema version 4).
func (s *PGStore) FailedSince(ctx context.Context, since time.Time, gws []string) (_ map[string]int, err error) {
	defer unavailable(&err)
	out := map[string]int{}
	if len(gws) == 0 {
		return out, nil
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	// The state is a literal: the planner matches a partial index's
	// predicate against constants only.
	rows, err := s.pool.Query(ctx, `SELECT gateway, count(*) FROM sortie_missions
		WHERE gateway = ANY($2::text[]) AND finished_ns >= $1 AND state = '`+string(driver.StateFailed)+`' GROUP BY gateway`, nsKey(since), gws)
	if err != nil {
		return nil, err
	}
	var gw string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&gw, &n}, func() error {
		out[gw] = n
		return nil
	})
	return out, err
}
