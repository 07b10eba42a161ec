package hub

import (
	"context"
	"testing"

	"github.com/sortie-edge/sortie/internal/clustertest"
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
		{"Retry", TestAFailureThatMayPassIsRetriedAsANewRelease},
	} {
		t.Run(tc.name, tc.run)
	}
}
