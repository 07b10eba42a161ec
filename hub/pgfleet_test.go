package hub

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// TestPGFleetStoreKeepsTheSameRollouts runs the rollout engine's cases
// over PostgreSQL: bundles, releases and the engine's records are kept
// there as in the bbolt file, and an engine made again from the
// database (a restart) resumes the same way. One replica drives; which
// one, in the cluster mode, is not decided yet (docs/fleet.md).
func TestPGFleetStoreKeepsTheSameRollouts(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	openFleetPG = func(tb testing.TB, fresh bool) *PGStore {
		tb.Helper()
		st, err := OpenPG(context.Background(), pg.DSN())
		if err != nil {
			tb.Fatal(err)
		}
		if fresh {
			if _, err := st.pool.Exec(context.Background(), `TRUNCATE sortie_bundles, sortie_releases, sortie_rollouts, sortie_targets, sortie_fleet, sortie_groups`); err != nil {
				tb.Fatal(err)
			}
		}
		return st
	}
	t.Cleanup(func() { openFleetPG = nil })
	for _, tc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Stages", TestRolloutReachesEveryGatewayInStagesWithOneOfferEach},
		{"CanaryAbort", TestCanaryFailureAbortsAndRollsBackTheCanariesThatTookIt},
		{"Deadline", TestOfflineGatewayEndsUnreachableAtTheDeadline},
		{"Restart", TestHubRestartResumesWithoutNotifyingAGatewayTwice},
		{"AbortSurvivesRestart", TestAbortDecisionSurvivesARestart},
		{"StatusOrder", TestOlderOrRepeatedStatusesNeverMoveAGatewayBack},
		{"Preflight", TestPreflightHoldsAWaveThatWouldFail},
		{"Drift", TestDriftShowsAndTheRevertPolicyOffersTheExpectedBundle},
		{"Push", TestPushRefusesABundleTheAgentWouldReject},
		{"Continuous", TestContinuousRolloutTakesInLateGatewaysAndOnesThatComeBack},
		{"Supersede", TestANewerRolloutOfTheGroupSupersedesTheActiveOne},
		{"GlanceConditions", TestOverviewCountsDriftAndRolloutsAndTheListFiltersByThem},
		{"RolloutPage", TestRolloutPageCountsEveryGatewayAndPagesSome},
		{"Retry", TestAFailureThatMayPassIsRetriedAsANewRelease},
		{"UnwrittenChange", TestAnOperatorChangeThatCannotBeWrittenChangesNothing},
		{"Retention", TestEndedRolloutsPastRetentionAreForgotten},
		{"LostRevert", TestARevertWhoseStatusWasLostEndsFailedFromItsHeartbeat},
	} {
		t.Run(tc.name, tc.run)
	}
}

// TestPGLeaderWhoseSessionIsGoneCannotWrite: the rollouts' records are
// written on the lead lock's own session, so a replica whose session
// PostgreSQL ended (and with it the lock) cannot overwrite what the next
// leader writes, even before it notices it lost the lead.
func TestPGLeaderWhoseSessionIsGoneCannotWrite(t *testing.T) {
	pg := clustertest.StartPostgres(t, clustertest.PostgresOptions{Settings: map[string]string{"fsync": "off"}})
	ctx := context.Background()
	open := func() *PGStore {
		st, err := OpenPG(ctx, pg.DSN())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	a, b := open(), open()
	held, _, releaseA, err := a.Lead(ctx)
	if err != nil || !held {
		t.Fatalf("first replica's lead: %v, %v", held, err)
	}
	defer releaseA()
	save := func(st *PGStore, group string) error {
		return st.SaveFleet(ctx, FleetState{Groups: []*Group{{Name: group}}})
	}
	if err := save(a, "by-a"); err != nil {
		t.Fatalf("the leader's save: %v", err)
	}
	if held, _, _, err := b.Lead(ctx); err != nil || held {
		t.Fatalf("second replica took the lead while the first holds it: %v, %v", held, err)
	}
	// PostgreSQL ends the leader's session, as a network cut would.
	var pid int
	if err := b.pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = $1`, int64(leadLock&0xffffffff)).Scan(&pid); err != nil {
		t.Fatalf("the lead lock's holder: %v", err)
	}
	if _, err := b.pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid); err != nil {
		t.Fatal(err)
	}
	var heldB bool
	var releaseB func()
	testkit.Eventually(t, 10*time.Second, "the second replica takes the lead", func() bool {
		heldB, _, releaseB, err = b.Lead(ctx)
		return err == nil && heldB
	})
	defer releaseB()
	if err := save(b, "by-b"); err != nil {
		t.Fatalf("the new leader's save: %v", err)
	}
	if err := save(a, "by-a-late"); err == nil {
		t.Fatal("the old leader, its session gone, still wrote its records")
	}
	st, err := b.LoadFleet(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range st.Groups {
		names = append(names, g.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"by-a", "by-b"}) {
		t.Fatalf("groups %v, want the old leader's before its session ended and the new leader's", names)
	}
	releaseA()
	if err := save(a, "by-a-after-release"); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a save after giving the lead up: %v, want ErrNotLeader", err)
	}
}
