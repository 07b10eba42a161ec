package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sortie-edge/sortie/bundle"
)

// ConfigRef names a configuration the agent runs or ran: its bundle's
// hash, its version (0 unless a hub numbered it), where it came from
// ("files", "local" or "hub", as uplink's Source constants) and since
// when it runs.
type ConfigRef struct {
	Hash    string    `json:"hash"`
	Version uint64    `json:"version,omitempty"`
	Source  string    `json:"source"`
	Rollout string    `json:"rollout,omitempty"`
	Since   time.Time `json:"since"`
}

// BundleOutcome is what became of a bundle the agent was given: Status
// is one of uplink's Bundle constants (received, rejected, applied,
// healthy, reverted), Reason one of its Reason constants, Current the
// hash that runs after it.
type BundleOutcome struct {
	ConfigRef
	Status  string    `json:"status"`
	Reason  string    `json:"reason,omitempty"`
	Message string    `json:"message,omitempty"`
	At      time.Time `json:"at"`
	Current string    `json:"current"`
}

// ConfigTrial is a bundle on trial: applied, its health watched until
// Until (and, for a hub's bundle, the hub connection until ConfirmBy).
type ConfigTrial struct {
	Until     time.Time `json:"until"`
	ConfirmBy time.Time `json:"confirm_by"`
	// Scenes are those the bundle changed, Devices those they use: a
	// mission of them that fails, or a device that does not answer by
	// Until, reverts the bundle.
	Scenes  []string `json:"scenes"`
	Devices []string `json:"devices"`
}

// ConfigInfo is GET /api/config: what runs, from where, since when.
type ConfigInfo struct {
	Current ConfigRef    `json:"current"`
	Trial   *ConfigTrial `json:"trial,omitempty"`
	// Previous is what a revert goes back to, while on trial.
	Previous *ConfigRef `json:"previous,omitempty"`
	// HubVersion is the newest version taken from the hub.
	HubVersion uint64         `json:"hub_version,omitempty"`
	Last       *BundleOutcome `json:"last,omitempty"`
	// FilesHash is the hash of the bundle agent.toml's files make now,
	// when it differs from what runs: they were edited since the agent
	// started, or a bundle runs instead of them.
	FilesHash string `json:"files_hash,omitempty"`
}

// ErrNoBundles is returned by Options.Apply when the agent takes none.
var ErrNoBundles = errors.New("this agent takes no configuration bundles")

func (s *Handler) config(w http.ResponseWriter, _ *http.Request) {
	if s.opts.Config == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, ErrNoBundles.Error())
		return
	}
	writeJSON(w, http.StatusOK, s.opts.Config())
}

// applyBundle takes a bundle's canonical encoding as the body and
// answers with its outcome: applied (on trial) or rejected, with why.
func (s *Handler) applyBundle(w http.ResponseWriter, r *http.Request) {
	if s.opts.Apply == nil {
		writeError(w, http.StatusNotFound, CodeNotFound, ErrNoBundles.Error())
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, bundle.MaxEncoded)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, CodeTooLarge, fmt.Sprintf("a bundle is at most %d bytes encoded", bundle.MaxEncoded))
			return
		}
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	out, err := s.opts.Apply(r.Context(), body)
	if err != nil {
		writeError(w, http.StatusBadRequest, CodeBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// Apply sends a bundle's canonical encoding to the agent and returns
// what it did with it.
func (c *Client) Apply(ctx context.Context, encoded []byte) (BundleOutcome, error) {
	var out BundleOutcome
	_, err := c.Call(ctx, http.MethodPost, "/api/config/bundle", json.RawMessage(encoded), &out)
	return out, err
}

// Config returns what the agent runs.
func (c *Client) Config(ctx context.Context) (ConfigInfo, error) {
	var out ConfigInfo
	_, err := c.Call(ctx, http.MethodGet, "/api/config", nil, &out)
	return out, err
}
