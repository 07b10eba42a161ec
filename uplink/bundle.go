package uplink

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sortie-edge/sortie/bundle"
	"github.com/sortie-edge/sortie/driver"
)

// Configuration sources, in ConfigState.Source and BundleStatus.
const (
	SourceFiles = "files" // the files agent.toml names
	SourceLocal = "local" // "agent apply DIR" or the agent's API
	SourceHub   = "hub"   // a BundleOffer
)

// Bundle statuses, in the order a gateway reports them. Received,
// Applied and Healthy are steps; Rejected and Reverted end a bundle's
// attempt, as Healthy does.
const (
	BundleReceived = "received" // taken, durably noted; validation follows
	BundleRejected = "rejected" // not applied: Reason says why; nothing changed
	BundleApplied  = "applied"  // running, on trial: new triggers use it
	BundleHealthy  = "healthy"  // the trial passed: committed
	BundleReverted = "reverted" // the trial failed, or was cut short: back on the previous bundle
)

// Reasons a bundle is rejected or reverted (BundleStatus.Reason).
const (
	ReasonInvalid           = "invalid"            // a file does not validate ("agent validate"'s rules)
	ReasonValidationTimeout = "validation_timeout" // validating took longer than the gateway allows
	ReasonAgentTooOld       = "agent_too_old"      // the bundle's min_agent is newer than the agent
	ReasonRegistryChanged   = "registry_changed"   // the registry changes what the embedded broker's access rules took at start
	ReasonRegistryRefused   = "registry_refused"   // the device layer could not take the registry (a subscription refused)
	ReasonStorage           = "storage"            // the gateway could not stage it on disk
	ReasonDevicesSilent     = "devices_silent"     // devices its changed scenes use did not answer in the soak
	ReasonMissionFailed     = "mission_failed"     // a mission of a changed scene failed in the soak
	ReasonUplinkDown        = "uplink_down"        // no hub connection by the end of the confirm window
	ReasonRestarted         = "restarted"          // the agent restarted before the bundle was confirmed
	ReasonSuperseded        = "superseded"         // a newer bundle came while it was on trial
)

// maxBundleText bounds the free text of a bundle status.
const maxBundleText = 4096

// BundleOffer is a bundle the hub asks a gateway to run (Control.Bundle
// with Action "bundle").
type BundleOffer struct {
	// Hash is the hex SHA-256 of Bundle (bundle.HashOf).
	Hash string `json:"hash"`
	// Version orders the bundles of the gateway's target group: a
	// gateway ignores an offer older than the newest it has taken, and
	// answers one it has taken from what it did then. A rollback is a
	// newer version of an older bundle.
	Version uint64 `json:"version"`
	// Rollout, optional, names the hub's rollout; echoed in statuses.
	Rollout string `json:"rollout,omitempty"`
	// SoakSeconds, optional, is how long the gateway watches its health
	// before it reports healthy (1 to 86,400); absent: its own setting.
	SoakSeconds float64 `json:"soak_seconds,omitempty"`
	// Bundle is the bundle's canonical encoding (package bundle).
	Bundle json.RawMessage `json:"bundle"`
}

func (o *BundleOffer) check() error {
	if err := checkHash(o.Hash); err != nil {
		return err
	}
	if o.Version == 0 {
		return fmt.Errorf("%w: bundle version 0 (versions start at 1)", ErrMessage)
	}
	if o.Rollout != "" {
		if err := validID("rollout", o.Rollout); err != nil {
			return err
		}
	}
	if o.SoakSeconds != 0 && !(o.SoakSeconds >= 1 && o.SoakSeconds <= 86400) {
		return fmt.Errorf("%w: soak_seconds %v is not between 1 and 86400", ErrMessage, o.SoakSeconds)
	}
	if got := bundle.HashOf(o.Bundle); got != o.Hash {
		return fmt.Errorf("%w: the bundle's bytes hash to %s, not %s", ErrMessage, bundle.Short(got), bundle.Short(o.Hash))
	}
	return nil
}

// Soak is SoakSeconds as a duration; zero when absent.
func (o *BundleOffer) Soak() time.Duration {
	return time.Duration(o.SoakSeconds * float64(time.Second))
}

func checkHash(h string) error {
	if len(h) != 64 {
		return fmt.Errorf("%w: bundle hash %q is not 64 hex digits", ErrMessage, h)
	}
	if _, err := hex.DecodeString(h); err != nil {
		return fmt.Errorf("%w: bundle hash %q is not 64 hex digits", ErrMessage, h)
	}
	return nil
}

// ConfigState is the configuration a gateway runs, in its heartbeats.
type ConfigState struct {
	// Hash is the running bundle's (bundle.Bundle.Hash): for a gateway
	// on its files, the hash of the bundle those files make.
	Hash string `json:"hash"`
	// Version is the bundle's version; 0 for files and local bundles.
	Version uint64 `json:"version,omitempty"`
	// Source is SourceFiles, SourceLocal or SourceHub.
	Source string `json:"source"`
	// Since is when it started running.
	Since time.Time `json:"since"`
	// Trial is set while it is on trial (applied, not yet healthy).
	Trial bool `json:"trial,omitempty"`
	// Files, when set, is the hash of the bundle the gateway's config
	// files make now, which differs from Hash: they were edited since the
	// start (in force at the next one), or a bundle runs instead of them.
	Files string `json:"files,omitempty"`
	// SwapsRegistry says the agent takes a bundle whose devices.toml
	// differs without a restart; an agent without it rejects one
	// (ReasonRegistryChanged), which a hub's pre-flight can foresee.
	SwapsRegistry bool `json:"swaps_registry,omitempty"`
}

// BundleStatus tells the hub what became of a bundle it offered. A
// gateway sends each step once as it happens and its latest again on
// every connection, so a hub keys them by (gateway, version, status).
type BundleStatus struct {
	Gateway string `json:"gateway"`
	Hash    string `json:"hash"`
	Version uint64 `json:"version"`
	Rollout string `json:"rollout,omitempty"`
	// Status is BundleReceived, ..., BundleReverted.
	Status string `json:"status"`
	// Reason, for BundleRejected and BundleReverted, is one of the
	// Reason constants; Message says it for people.
	Reason  string `json:"reason,omitempty"`
	Message string `json:"message,omitempty"`
	// Current is the hash the gateway runs after this status.
	Current string    `json:"current"`
	At      time.Time `json:"at"`
}

// DecodeBundleStatus parses and checks a bundle status.
func DecodeBundleStatus(b []byte) (BundleStatus, error) {
	var s BundleStatus
	if err := decode(b, &s); err != nil {
		return BundleStatus{}, err
	}
	if err := validID("gateway", s.Gateway); err != nil {
		return BundleStatus{}, err
	}
	if err := checkHash(s.Hash); err != nil {
		return BundleStatus{}, err
	}
	if s.Current != "" {
		if err := checkHash(s.Current); err != nil {
			return BundleStatus{}, err
		}
	}
	switch s.Status {
	case BundleReceived, BundleApplied, BundleHealthy:
	case BundleRejected, BundleReverted:
		if s.Reason == "" {
			return BundleStatus{}, fmt.Errorf("%w: a %s bundle status without a reason", ErrMessage, s.Status)
		}
	default:
		return BundleStatus{}, fmt.Errorf("%w: bundle status %q", ErrMessage, s.Status)
	}
	if len(s.Reason) > 64 || len(s.Message) > maxBundleText || len(s.Rollout) > maxBundleText {
		return BundleStatus{}, fmt.Errorf("%w: bundle status text too long", ErrMessage)
	}
	return s, nil
}

func validID(what, id string) error {
	if err := driver.ValidateID(what, id); err != nil {
		return fmt.Errorf("%w: %w", ErrMessage, err)
	}
	return nil
}
