package hub

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// pgOutcomes adds the transaction's deltas to the PostgreSQL roll-up,
// element by element, in key order (outcomeDeltas sorts them), so that
// replicas adding to the same rows (every gateway adds to scope "*")
// lock them in one order.
func pgOutcomes(ctx context.Context, tx pgx.Tx, ds []outcomeDelta) error {
	for _, d := range ds {
		if _, err := tx.Exec(ctx, `INSERT INTO sortie_outcomes (scope, hour, v) VALUES ($1, $2, $3)
			ON CONFLICT (scope, hour) DO UPDATE SET v = (SELECT array_agg(coalesce(a, 0) + coalesce(b, 0) ORDER BY i)
				FROM unnest(sortie_outcomes.v, excluded.v) WITH ORDINALITY AS t(a, b, i))`,
			d.scope, d.hour, d.v[:]); err != nil {
			return fmt.Errorf("write outcomes: %w", err)
		}
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
