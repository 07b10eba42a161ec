package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/sortie-edge/sortie/uplink"
)

// FleetStore is where the rollout engine (Fleet) keeps its state: the
// bundles and their releases, and the rollouts, each rollout's
// gateways, each gateway's bundle state and the groups' settings,
// written before anything they allow is sent. The single hub's bbolt
// Store is one.
type FleetStore interface {
	BundleStore
	// LoadFleet reads everything the engine keeps.
	LoadFleet(ctx context.Context) (FleetState, error)
	// SaveFleet writes records in one transaction.
	SaveFleet(ctx context.Context, c FleetState) error
}

// FleetState is the engine's records (what LoadFleet reads, or what
// SaveFleet writes: the records changed).
type FleetState struct {
	Rollouts []*Rollout
	// Targets are the rollouts' gateways (RolloutGateway.Rollout names
	// each one's rollout).
	Targets  []*RolloutGateway
	Gateways []*FleetGateway
	Groups   []*Group
	// Forget names ended rollouts to delete with their gateways
	// (SaveFleet only): retention (FleetOptions.KeepRollouts).
	Forget []string
}

// Rollout states. Running, Paused and Aborting are active; the others
// are ended (a continuous rollout that completed still follows its
// target: FollowingFleet).
const (
	RolloutRunning    = "running"
	RolloutPaused     = "paused"
	RolloutAborting   = "aborting" // rolling back the gateways that took it
	RolloutAborted    = "aborted"
	RolloutCompleted  = "completed"
	RolloutSuperseded = "superseded"
)

// Rollout is one bundle release sent to a set of gateways in stages.
type Rollout struct {
	ID      string      `json:"id"`
	Spec    RolloutSpec `json:"spec"`
	Version uint64      `json:"version"`
	Hash    string      `json:"hash"`
	State   string      `json:"state"`
	// Reason says why it is paused, aborting or ended.
	Reason   string    `json:"reason,omitempty"`
	Created  time.Time `json:"created"`
	Updated  time.Time `json:"updated"`
	Deadline time.Time `json:"deadline"`
	Ended    time.Time `json:"ended,omitzero"`
	// Stages are cumulative counts of targets: stage i notifies the
	// targets of order Stages[i-1] to Stages[i]-1 (stage 0, the canary,
	// from 0). Continuous targets joining later are added to the last.
	Stages []int `json:"stages"`
	// Stage is the stage under way (forward, or while Aborting the
	// rollback's); StageStarted is when its gateways were first
	// notified (zero: not yet, the pre-flight check comes first) and
	// StageSettled when every one of them ended or timed out (its soak
	// runs from there).
	Stage        int       `json:"stage"`
	StageStarted time.Time `json:"stage_started,omitzero"`
	StageSettled time.Time `json:"stage_settled,omitzero"`
	// Aborted is when the abort was decided; Rollback maps each hash
	// the gateways ran before to the release that offers it back.
	Aborted  time.Time         `json:"aborted,omitzero"`
	Rollback map[string]uint64 `json:"rollback,omitempty"`
	// Following: a continuous rollout, completed, still offers its
	// release to gateways that join its target or come back.
	Following bool `json:"following,omitempty"`
}

func (r *Rollout) active() bool {
	return r.State == RolloutRunning || r.State == RolloutPaused || r.State == RolloutAborting
}

// Statuses of a rollout's gateway (RolloutGateway.Status).
const (
	TargetPending     = "pending"     // its stage has not come
	TargetNotified    = "notified"    // offered; no answer yet
	TargetReceived    = "received"    // the gateway took the offer
	TargetApplied     = "applied"     // running it, on trial
	TargetHealthy     = "healthy"     // kept after its trial
	TargetFailed      = "failed"      // rejected, reverted by the gateway, or stale: Reason says which
	TargetUnreachable = "unreachable" // no outcome by the deadline
	TargetSkipped     = "skipped"     // refused by the pre-flight check, and the operator went on without it
	TargetNotSent     = "not_sent"    // the rollout ended (aborted, deadline) before its stage
	TargetSuperseded  = "superseded"  // a newer rollout of the group took over before an outcome
)

// Rollback statuses of a rollout's gateway (RolloutGateway.Back).
const (
	BackPending     = "pending"
	BackNotified    = "notified"
	BackRolledBack  = "rolled_back"
	BackFailed      = "failed"
	BackUnreachable = "unreachable"
)

// RolloutGateway is one gateway of a rollout.
type RolloutGateway struct {
	Rollout string `json:"rollout"`
	Gateway string `json:"gateway"`
	// Order places it in the rollout (stages count it); Stage is the
	// stage it belongs to.
	Order  int    `json:"order"`
	Stage  int    `json:"stage"`
	Status string `json:"status"`
	// Reason and Message: why it failed (a bundle status's reason,
	// "stale", ...).
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Refused is why the pre-flight check holds its stage.
	Refused string `json:"refused,omitempty"`
	// Version is the release offered (a retry numbers a new one).
	Version uint64 `json:"version,omitempty"`
	// Control is the ID of the offer: every resend of it carries the
	// same, so the gateway answers a repeat from memory.
	Control string `json:"control,omitempty"`
	// Offers counts offers with a new control ID (first and retries);
	// Sends counts every publish, resends included.
	Offers   int       `json:"offers,omitempty"`
	Sends    int       `json:"sends,omitempty"`
	Notified time.Time `json:"notified,omitzero"`
	Sent     time.Time `json:"sent,omitzero"`
	Answered bool      `json:"answered,omitempty"`
	Updated  time.Time `json:"updated,omitzero"`
	// Previous is the hash it ran when first offered: what an abort
	// puts back.
	Previous string `json:"previous,omitempty"`
	// Back is its rollback after an abort ("" none), with the release,
	// control and times of that offer.
	Back         string    `json:"back,omitempty"`
	BackVersion  uint64    `json:"back_version,omitempty"`
	BackControl  string    `json:"back_control,omitempty"`
	BackStage    int       `json:"back_stage,omitempty"`
	BackNotified time.Time `json:"back_notified,omitzero"`
	BackSent     time.Time `json:"back_sent,omitzero"`
	BackReason   string    `json:"back_reason,omitempty"`
}

func (t *RolloutGateway) ended() bool {
	switch t.Status {
	case TargetHealthy, TargetFailed, TargetUnreachable, TargetSkipped, TargetNotSent, TargetSuperseded:
		return true
	}
	return false
}

// executed says the gateway ran the bundle to an outcome: what the
// abort threshold counts.
func (t *RolloutGateway) executed() bool {
	return t.Status == TargetHealthy || t.Status == TargetFailed
}

// took says the gateway may be running the bundle, so an abort rolls
// it back.
func (t *RolloutGateway) took() bool {
	switch t.Status {
	case TargetNotified, TargetReceived, TargetApplied, TargetHealthy:
		return true
	}
	return false
}

func (t *RolloutGateway) backEnded() bool {
	return t.Back == BackRolledBack || t.Back == BackFailed || t.Back == BackUnreachable
}

// Drift policies of a Group.
const (
	DriftAlert  = "alert"  // show it (API, metric); change nothing
	DriftAdopt  = "adopt"  // take what the gateway runs as what it should run
	DriftRevert = "revert" // offer the gateway the bundle it should run again
)

// Group is a target group's settings.
type Group struct {
	Name        string `json:"name"`
	DriftPolicy string `json:"drift_policy"`
}

// FleetGateway is what the hub knows of one gateway's configuration.
type FleetGateway struct {
	Gateway string `json:"gateway"`
	// Tags are assigned on the hub (PUT /api/gateways/{gw}/tags);
	// rollouts target them.
	Tags []string `json:"tags,omitempty"`
	// Group is the group of the last rollout that targeted it.
	Group string `json:"group,omitempty"`
	// The newest bundle status: Version never goes back (a status of an
	// older version is old news), and within a version a step does not
	// go back either (received, applied, then an end).
	Version uint64    `json:"version,omitempty"`
	Hash    string    `json:"hash,omitempty"`
	Status  string    `json:"status,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	At      time.Time `json:"at,omitzero"`
	// Expected is the bundle it should run: the last one it kept from
	// the hub (healthy), or adopted. Empty: the hub expects nothing.
	Expected        string `json:"expected,omitempty"`
	ExpectedVersion uint64 `json:"expected_version,omitempty"`
	// Config is what its last heartbeat said it runs.
	Config *uplink.ConfigState `json:"config,omitempty"`
	// Drifted is set while Config.Hash is not Expected, or its config
	// files were edited by hand (Drift says which), and no rollout or
	// trial explains it, since DriftSince.
	Drifted    bool      `json:"drifted,omitempty"`
	Drift      string    `json:"drift,omitempty"` // DriftConfig or DriftFiles
	DriftSince time.Time `json:"drift_since,omitzero"`
	// Revert is the control of the drift policy's last offer, and when.
	RevertControl string    `json:"revert_control,omitempty"`
	RevertVersion uint64    `json:"revert_version,omitempty"`
	RevertHash    string    `json:"revert_hash,omitempty"`
	RevertSent    time.Time `json:"revert_sent,omitzero"`
}

var (
	bucketRollouts = []byte("rollouts") // id -> Rollout
	bucketTargets  = []byte("targets")  // rollout 0x00 gateway -> RolloutGateway
	bucketFleet    = []byte("fleet")    // gateway -> FleetGateway
	bucketGroups   = []byte("groups")   // name -> Group
)

// fleetBuckets are created by Open with the others.
var fleetBuckets = [][]byte{bucketBundles, bucketBundleData, bucketReleases, bucketGroupHead, bucketRollouts, bucketTargets, bucketFleet, bucketGroups}

// LoadFleet implements FleetStore.
func (s *Store) LoadFleet(ctx context.Context) (FleetState, error) {
	var st FleetState
	err := s.view(ctx, func(tx *bolt.Tx) error {
		if err := loadAll(tx.Bucket(bucketRollouts), &st.Rollouts); err != nil {
			return err
		}
		if err := loadAll(tx.Bucket(bucketTargets), &st.Targets); err != nil {
			return err
		}
		if err := loadAll(tx.Bucket(bucketFleet), &st.Gateways); err != nil {
			return err
		}
		return loadAll(tx.Bucket(bucketGroups), &st.Groups)
	})
	return st, err
}

func loadAll[T any](b *bolt.Bucket, out *[]*T) error {
	return b.ForEach(func(k, v []byte) error {
		p := new(T)
		if err := json.Unmarshal(v, p); err != nil {
			return fmt.Errorf("decode %s: %w", k, err)
		}
		*out = append(*out, p)
		return nil
	})
}

// SaveFleet implements FleetStore.
func (s *Store) SaveFleet(ctx context.Context, c FleetState) error {
	return s.update(ctx, func(tx *bolt.Tx) error {
		for _, r := range c.Rollouts {
			if err := putJSON(tx.Bucket(bucketRollouts), []byte(r.ID), r); err != nil {
				return err
			}
		}
		for _, t := range c.Targets {
			if err := putJSON(tx.Bucket(bucketTargets), missionKey(t.Rollout, t.Gateway), t); err != nil {
				return err
			}
		}
		for _, g := range c.Gateways {
			if err := putJSON(tx.Bucket(bucketFleet), []byte(g.Gateway), g); err != nil {
				return err
			}
		}
		for _, g := range c.Groups {
			if err := putJSON(tx.Bucket(bucketGroups), []byte(g.Name), g); err != nil {
				return err
			}
		}
		for _, id := range c.Forget {
			if err := forgetRollout(tx, id); err != nil {
				return err
			}
		}
		return nil
	})
}

// forgetRollout deletes a rollout and its gateways.
func forgetRollout(tx *bolt.Tx, id string) error {
	if err := tx.Bucket(bucketRollouts).Delete([]byte(id)); err != nil {
		return err
	}
	return deletePrefix(tx.Bucket(bucketTargets), missionKey(id, ""))
}
