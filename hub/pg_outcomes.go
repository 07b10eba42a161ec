package hub

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pgOutcomes adds the transaction's deltas to the PostgreSQL roll-up,
// element by element, in one statement (a transaction of 500 missions
// touches some 500 rows: a statement each was most of an ingest's
// time), in key order (outcomeDeltas sorts them, and the rows of an
// INSERT ... SELECT are taken in the order of its unnest), so that
// replicas adding to the same rows (every gateway adds to scope "*")
// lock them in one order. The rows' counters travel as one flat array,
// row i at [i*rollupLen+1, (i+1)*rollupLen].
func pgOutcomes(ctx context.Context, tx pgx.Tx, ds []outcomeDelta) error {
	if len(ds) == 0 {
		return nil
	}
	scopes, hours, flat := make([]string, len(ds)), make([]int64, len(ds)), make([]int64, 0, len(ds)*rollupLen)
	for i, d := range ds {
		scopes[i], hours[i] = d.scope, d.hour
		flat = append(flat, d.v[:]...)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO sortie_outcomes (scope, hour, v)
		SELECT s, h, ($3::bigint[])[(i-1)*$4+1 : i*$4] FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS t(s, h, i) ORDER BY i
		ON CONFLICT (scope, hour) DO UPDATE SET v = (SELECT array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i)
			FROM unnest(sortie_outcomes.v, excluded.v) WITH ORDINALITY AS t(a, b, i))`,
		scopes, hours, flat, rollupLen); err != nil {
		return fmt.Errorf("write outcomes: %w", err)
	}
	return nil
}

// OutcomeHours returns the roll-up rows of scope from hour from to hour
// to (hours since 1970 UTC, to excluded).
func (s *PGStore) OutcomeHours(ctx context.Context, scope string, from, to int64) (_ map[int64]OutcomeRow, err error) {
	defer unavailable(&err)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	rows, err := s.pool.Query(ctx, `SELECT hour, v FROM sortie_outcomes WHERE scope = $1 AND hour >= $2 AND hour < $3`, scope, from, to)
	if err != nil {
		return nil, err
	}
	out := map[int64]OutcomeRow{}
	var hour int64
	var v []int64
	_, err = pgx.ForEachRow(rows, []any{&hour, &v}, func() error {
		var r OutcomeRow
		copy(r[:], v)
		out[hour] = r
		return nil
	})
	return out, err
}
