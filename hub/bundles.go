package hub

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Kinds of a Release: why a version was numbered.
const (
	ReleasePush     = "push"     // hub bundle push, POST /api/bundles
	ReleaseRetry    = "retry"    // a rollout offering a gateway the same bundle again after a failure that may pass
	ReleaseRollback = "rollback" // an abort offering gateways what they ran before
	ReleaseRevert   = "revert"   // the drift policy "revert" offering a gateway the bundle it should run
)

// DefaultGroup is the target group of a bundle pushed without one.
const DefaultGroup = "default"

// Release is one version of a target group: a number the hub gives a
// bundle it offers, so that gateways can tell newer from older (a
// gateway never moves to an older version). Versions come from one
// counter for the whole hub, so they increase within every group, and
// a gateway moved from one group to another never sees a smaller one.
// A rollback is a newer release of older content.
type Release struct {
	Version uint64    `json:"version"`
	Group   string    `json:"group"`
	Hash    string    `json:"hash"`
	Kind    string    `json:"kind"`
	Rollout string    `json:"rollout,omitempty"`
	At      time.Time `json:"at"`
}

// BundleInfo describes a stored bundle (GET /api/bundles/{ref}).
type BundleInfo struct {
	Hash     string    `json:"hash"`
	MinAgent string    `json:"min_agent,omitempty"`
	Size     int       `json:"size"`
	Files    []string  `json:"files"`
	Pushed   time.Time `json:"pushed"`
	Releases []Release `json:"releases,omitempty"`
}

// BundleStore keeps bundles (immutable, by hash) and their releases.
// The single hub's bbolt Store is one; the cluster mode has none yet.
type BundleStore interface {
	// PutBundle stores a bundle's canonical encoding under its hash
	// (info.Hash; a second push of the same bytes stores nothing) and
	// numbers a release of it in group, unless the group's latest
	// release is already this bundle: that release is returned, with
	// created false.
	PutBundle(ctx context.Context, group string, info BundleInfo, encoded []byte, now time.Time) (rel Release, created bool, err error)
	// AddRelease numbers a new release of a stored bundle (r.Version is
	// ignored and returned filled in).
	AddRelease(ctx context.Context, r Release) (Release, error)
	// Bundle returns a stored bundle's info and encoding, or an error
	// wrapping ErrNotFound.
	Bundle(ctx context.Context, hash string) (BundleInfo, []byte, error)
	// Releases lists the releases of group ("" every group), newest
	// first.
	Releases(ctx context.Context, group string) ([]Release, error)
}

var (
	bucketBundles    = []byte("bundles")    // hash -> BundleInfo
	bucketBundleData = []byte("bundledata") // hash -> canonical encoding
	bucketReleases   = []byte("releases")   // version (big-endian) -> Release
	bucketGroupHead  = []byte("grouphead")  // group -> its latest version (big-endian)
	keyVersion       = []byte("version")    // meta: the last version numbered
)

// PutBundle implements BundleStore.
func (s *Store) PutBundle(ctx context.Context, group string, info BundleInfo, encoded []byte, now time.Time) (Release, bool, error) {
	var rel Release
	created := false
	err := s.update(ctx, func(tx *bolt.Tx) error {
		if tx.Bucket(bucketBundleData).Get([]byte(info.Hash)) == nil {
			info.Releases = nil
			if err := putJSON(tx.Bucket(bucketBundles), []byte(info.Hash), info); err != nil {
				return err
			}
			if err := tx.Bucket(bucketBundleData).Put([]byte(info.Hash), encoded); err != nil {
				return err
			}
		}
		if v := tx.Bucket(bucketGroupHead).Get([]byte(group)); v != nil {
			raw := tx.Bucket(bucketReleases).Get(v)
			if err := json.Unmarshal(raw, &rel); err != nil {
				return fmt.Errorf("decode release: %w", err)
			}
			if rel.Hash == info.Hash {
				return nil
			}
		}
		var err error
		rel, err = addRelease(tx, Release{Group: group, Hash: info.Hash, Kind: ReleasePush, At: now})
		created = true
		return err
	})
	return rel, created, err
}

// AddRelease implements BundleStore.
func (s *Store) AddRelease(ctx context.Context, r Release) (Release, error) {
	err := s.update(ctx, func(tx *bolt.Tx) error {
		if tx.Bucket(bucketBundleData).Get([]byte(r.Hash)) == nil {
			return fmt.Errorf("%w: bundle %s", ErrNotFound, r.Hash)
		}
		var err error
		r, err = addRelease(tx, r)
		return err
	})
	return r, err
}

func addRelease(tx *bolt.Tx, r Release) (Release, error) {
	meta := tx.Bucket(bucketMeta)
	var last uint64
	if v := meta.Get(keyVersion); len(v) == 8 {
		last = binary.BigEndian.Uint64(v)
	}
	r.Version = last + 1
	k := u64(r.Version)
	if err := meta.Put(keyVersion, k); err != nil {
		return r, err
	}
	if err := putJSON(tx.Bucket(bucketReleases), k, r); err != nil {
		return r, err
	}
	return r, tx.Bucket(bucketGroupHead).Put([]byte(r.Group), k)
}

// Bundle implements BundleStore.
func (s *Store) Bundle(ctx context.Context, hash string) (BundleInfo, []byte, error) {
	var info BundleInfo
	var enc []byte
	err := s.view(ctx, func(tx *bolt.Tx) error {
		raw := tx.Bucket(bucketBundles).Get([]byte(hash))
		if raw == nil {
			return fmt.Errorf("%w: bundle %s", ErrNotFound, hash)
		}
		if err := json.Unmarshal(raw, &info); err != nil {
			return fmt.Errorf("decode bundle info: %w", err)
		}
		enc = append([]byte(nil), tx.Bucket(bucketBundleData).Get([]byte(hash))...)
		return tx.Bucket(bucketReleases).ForEach(func(_, v []byte) error {
			var r Release
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode release: %w", err)
			}
			if r.Hash == hash {
				info.Releases = append(info.Releases, r)
			}
			return nil
		})
	})
	return info, enc, err
}

// Releases implements BundleStore.
func (s *Store) Releases(ctx context.Context, group string) ([]Release, error) {
	var out []Release
	err := s.view(ctx, func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketReleases).Cursor()
		n := 0
		for k, v := c.Last(); k != nil; k, v = c.Prev() {
			if n++; n%scanCheck == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			var r Release
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("decode release: %w", err)
			}
			if group == "" || r.Group == group {
				out = append(out, r)
			}
		}
		return nil
	})
	return out, err
}
