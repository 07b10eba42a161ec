package hub

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/uplink"
)

// schema is the bucket layout version recorded in meta: 1 until the
// gateway briefs, 2 since. A hub opens a file of its own version only,
// so once a file is at 2 no hub that does not keep the briefs writes
// beside them. A file at 1 gets the briefs (and the failed index)
// filled afresh at its first open: made before them, or by the first hub
// that kept them under version 1, whose file an older hub may have
// written since (leaving them stale).
const schema = 2

var (
	bucketMeta     = []byte("meta")
	bucketGateways = []byte("gateways")
	bucketMissions = []byte("missions")
	bucketTimeline = []byte("timeline")
	bucketOrder    = []byte("order")
	bucketFinished = []byte("finished")
	keySchema      = []byte("schema")
)

// Presence states of a Gateway. StateUnknown is a configured gateway
// that has never reported.
const (
	StateOnline  = uplink.StateOnline
	StateOffline = uplink.StateOffline
	StateUnknown = "unknown"
)

// Why a gateway is offline (Gateway.Why).
const (
	// OfflineWill: the broker published the gateway's last will, its
	// connection having ended without a goodbye.
	OfflineWill = "connection_lost"
	// OfflineGoodbye: the gateway said it was going (it stopped).
	OfflineGoodbye = "stopped"
	// OfflineSilent: nothing was heard from it for the hub's OfflineAfter,
	// whatever its connection says (a broker node that died publishes no
	// will).
	OfflineSilent = "heartbeats_stopped"
)

// Gateway is what the hub knows about one gateway.
type Gateway struct {
	ID      string    `json:"id"`
	State   string    `json:"state"` // online, offline or unknown
	Version string    `json:"version,omitempty"`
	Started time.Time `json:"started,omitzero"` // as reported by the gateway
	// Since is when State last changed, LastSeen when any message last
	// arrived, LastHeartbeat when the last heartbeat arrived (hub clock).
	Since         time.Time `json:"since,omitzero"`
	LastSeen      time.Time `json:"last_seen,omitzero"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	// Why says, while State is offline, what made it so: OfflineWill,
	// OfflineGoodbye, OfflineSilent ("" for records from before it).
	Why string `json:"why,omitempty"`
	// Broker is the address the gateway last said it connected to (its
	// online status): which node of a cluster it is on.
	Broker string `json:"broker,omitempty"`
	// PresenceAt is when the last status or heartbeat applied was
	// received (in the cluster mode, stored by the stream): one received
	// before it is older news, applied late by another replica, and
	// changes nothing.
	PresenceAt time.Time `json:"presence_at,omitzero"`
	// StatusAt is the same for the last status applied: what only a
	// status says (Protocol, Started, Broker) is the newest status's.
	StatusAt time.Time `json:"status_at,omitzero"`
	// Heartbeat is the last one received: backlog, active missions,
	// uptime and the device inventory.
	Heartbeat *uplink.Heartbeat `json:"heartbeat,omitempty"`
	// Acked is the highest outbox seq the hub has acknowledged: for a
	// gateway of protocol 2, the end of the chain of batches stored
	// (uplink.Batch.After); Pending are batches stored beyond a batch not
	// (yet) received, which join the chain once it arrives.
	// Outbox names the outbox they are about (uplink.Batch.Outbox).
	// TraceSeq is the highest trigger record seq stored.
	Acked    uint64 `json:"acked"`
	Pending  []Link `json:"pending,omitempty"`
	Outbox   string `json:"outbox,omitempty"`
	Protocol int    `json:"protocol,omitempty"`
	TraceSeq uint64 `json:"trace_seq,omitempty"`
	// Counters since the gateway was first seen. GapsFilled counts the
	// gaps that the missing events filled later (they arrived out of
	// order: a resend, or in the cluster mode another replica's batch
	// committed after this one's).
	Events     uint64 `json:"events"`
	Duplicates uint64 `json:"duplicates"`
	Gaps       uint64 `json:"gaps"`
	GapsFilled uint64 `json:"gaps_filled,omitempty"`
}

// Mission is the hub's record of one mission of one gateway.
type Mission struct {
	Gateway string         `json:"gateway"`
	ID      string         `json:"id"`
	Summary driver.Summary `json:"summary"`
	// Seq is the highest event seq stored; Summary belongs to it.
	Seq uint64 `json:"seq"`
	// Events counts the events stored.
	Events int `json:"events"`
	// Gaps are event seqs below Seq that the hub has not received.
	Gaps []Gap `json:"gaps,omitempty"`
	// Created orders missions: the summary's creation time, or the hub's
	// clock when the summary has none. It never changes.
	Created   time.Time `json:"created"`
	FirstSeen time.Time `json:"first_seen"`
	Updated   time.Time `json:"updated"` // hub clock of the last change
}

// Link is a stored batch of outbox entries, After to Last.
type Link struct {
	After uint64 `json:"after"`
	Last  uint64 `json:"last"`
}

// maxPending bounds Gateway.Pending: past it the link farthest from the
// cursor is forgotten (the new one, if it is the farthest), which costs
// only a resend (the gateway sends again what was not acknowledged, and
// the hub stores nothing twice). The nearest are kept: they join the
// chain first once the missing batch comes, and a replica held back on
// one batch while another stored many more (the cluster mode) is the
// usual way to get here.
const maxPending = 64

// advance moves the gateway's cursor along a batch from after to last:
// only when the batch continues what is stored does the cursor move, and
// then across every pending batch that now joins on.
func (g *Gateway) advance(after, last uint64) {
	if after > g.Acked {
		for _, l := range g.Pending {
			if l.After == after && l.Last >= last {
				return
			}
		}
		if len(g.Pending) == maxPending {
			far := 0
			for i, l := range g.Pending {
				if l.After > g.Pending[far].After {
					far = i
				}
			}
			if after >= g.Pending[far].After {
				return
			}
			g.Pending = append(g.Pending[:far], g.Pending[far+1:]...)
		}
		g.Pending = append(g.Pending, Link{After: after, Last: last})
		return
	}
	g.Acked = max(g.Acked, last)
	for moved := true; moved; {
		moved = false
		kept := g.Pending[:0]
		for _, l := range g.Pending {
			switch {
			case l.Last <= g.Acked:
			case l.After <= g.Acked:
				g.Acked, moved = l.Last, true
			default:
				kept = append(kept, l)
			}
		}
		g.Pending = kept
	}
	if len(g.Pending) == 0 {
		g.Pending = nil
	}
}

// Gap is a run of missing event seqs, From to To inclusive.
type Gap struct {
	From uint64 `json:"from"`
	To   uint64 `json:"to"`
	// Compacted gaps were dropped on purpose by the gateway's outbox and
	// will never arrive; the others may still.
	Compacted bool      `json:"compacted,omitempty"`
	Detected  time.Time `json:"detected"`
	// Origin is the From of the gap as detected, on the pieces a late
	// event split it into (0: not split, From is its origin).
	Origin uint64 `json:"origin,omitempty"`
}

func (g Gap) origin() uint64 {
	if g.Origin != 0 {
		return g.Origin
	}
	return g.From
}

// Options configures Open.
type Options struct {
	// Timeout bounds the wait for the file lock; default 5s.
	Timeout time.Duration
	// NoSync skips fsync (tests and benchmarks of everything else only).
	NoSync bool
	// Logger says what a long upgrade of the file does; nil is silent.
	Logger *slog.Logger
}

// Store keeps gateways and their missions in a bbolt file.
type Store struct {
	db *bolt.DB
}

// Open opens or creates the store at path, creating its directory and
// buckets.
func Open(path string, opts Options) (*Store, error) {
	orDefault(&opts.Timeout, 5*time.Second)
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("open hub store: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: opts.Timeout, NoSync: opts.NoSync})
	if err != nil {
		return nil, fmt.Errorf("open hub store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error { return migrateBolt(tx, path, opts.Logger) })
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open hub store %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// migrateBolt creates a new file's buckets, or brings a file of schema 1 (or
// of before the schema key) to schema.
func migrateBolt(tx *bolt.Tx, path string, log *slog.Logger) error {
	existing := tx.Bucket(bucketGateways) != nil
	for _, name := range append([][]byte{bucketMeta, bucketGateways, bucketMissions, bucketTimeline, bucketOrder, bucketFinished, bucketTraces,
		bucketBriefs, bucketFailed}, fleetBuckets...) {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %s: %w", name, err)
		}
	}
	meta := tx.Bucket(bucketMeta)
	v := meta.Get(keySchema)
	switch {
	case v == nil && !existing:
		return meta.Put(keySchema, u64(schema))
	case v != nil && (len(v) != 8 || binary.BigEndian.Uint64(v) == 0 || binary.BigEndian.Uint64(v) > schema):
		return fmt.Errorf("%w: hub store schema %x, want at most %d (a newer hub's file?)", ErrInvalid, v, schema)
	case v != nil && binary.BigEndian.Uint64(v) == schema:
		return nil
	}
	// About a minute for a million missions: said, so that an operator
	// does not take the silent start for a hang.
	start := time.Now()
	if log != nil {
		log.Info("upgrading the store: filling the gateway briefs and the index of failed missions, once (about a minute per million missions)", "path", path)
	}
	for _, name := range [][]byte{bucketBriefs, bucketFailed} {
		if err := tx.DeleteBucket(name); err != nil {
			return fmt.Errorf("refill bucket %s: %w", name, err)
		}
		if _, err := tx.CreateBucket(name); err != nil {
			return fmt.Errorf("refill bucket %s: %w", name, err)
		}
	}
	if err := backfillBriefs(tx); err != nil {
		return fmt.Errorf("gateway briefs: %w", err)
	}
	if log != nil {
		log.Info("store upgraded", "path", path, "schema", schema, "took", time.Since(start).Round(time.Millisecond))
	}
	return meta.Put(keySchema, u64(schema))
}

// Close releases the file.
func (s *Store) Close() error { return s.db.Close() }

// Register makes configured gateways known before they first connect,
// so the dashboard lists them (as "unknown") and control requests to
// them fail as offline rather than as unknown. It runs at start-up, when
// presence recorded by the previous run is stale: gateways seen online
// become "unknown" until their (retained) status arrives again.
func (s *Store) Register(ctx context.Context, now time.Time, ids ...string) error {
	for _, id := range ids {
		if err := driver.ValidateID("gateway", id); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	return s.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGateways)
		for _, id := range ids {
			if raw := b.Get([]byte(id)); raw != nil {
				var g Gateway
				if err := json.Unmarshal(raw, &g); err != nil || g.State != StateOnline {
					continue
				}
				g.State, g.Since = StateUnknown, now
				if err := putGateway(tx, &g); err != nil {
					return err
				}
				continue
			}
			if err := putGateway(tx, &Gateway{ID: id, State: StateUnknown, Since: now}); err != nil {
				return err
			}
		}
		return nil
	})
}

// Gateway returns one gateway or ErrUnknownGateway.
func (s *Store) Gateway(ctx context.Context, id string) (Gateway, error) {
	var g Gateway
	err := s.view(ctx, func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketGateways).Get([]byte(id))
		if v == nil {
			return fmt.Errorf("%w: %q", ErrUnknownGateway, id)
		}
		return json.Unmarshal(v, &g)
	})
	return g, err
}

// Gateways returns every known gateway, by ID.
func (s *Store) Gateways(ctx context.Context) ([]Gateway, error) {
	var out []Gateway
	err := s.view(ctx, func(tx *bolt.Tx) error {
		return tx.Bucket(bucketGateways).ForEach(func(_, v []byte) error {
			var g Gateway
			if err := json.Unmarshal(v, &g); err != nil {
				return fmt.Errorf("decode gateway: %w", err)
			}
			out = append(out, g)
			return nil
		})
	})
	return out, err
}

// scanCheck is how many keys a long scan reads between two looks at its
// context.
const scanCheck = 1024

// update runs fn in a read-write transaction unless ctx is done. bbolt
// cannot cancel a transaction; long scans in fn check ctx themselves
// (scanCheck), and their error rolls the transaction back.
func (s *Store) update(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.db.Update(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

// view is update for a read-only transaction.
func (s *Store) view(ctx context.Context, fn func(tx *bolt.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	err := s.db.View(fn)
	if errors.Is(err, berrors.ErrDatabaseNotOpen) {
		return ErrClosed
	}
	return err
}

func u64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// missionKey is gateway + 0x00 + mission ID.
func missionKey(gw, id string) []byte {
	k := make([]byte, 0, len(gw)+1+len(id))
	k = append(k, gw...)
	k = append(k, 0)
	return append(k, id...)
}

// eventKey is missionKey + 0x00 + seq (big-endian), so a mission's
// events sort by seq and share a prefix.
func eventKey(mk []byte, seq uint64) []byte {
	k := make([]byte, 0, len(mk)+9)
	k = append(k, mk...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, seq)
}

// timeKey prefixes a mission key with a big-endian timestamp so that
// byte order is time order. Times before 1970 sort first.
func timeKey(t time.Time, mk []byte) []byte {
	ns := t.UnixNano()
	if ns < 0 || t.IsZero() {
		ns = 0
	}
	k := make([]byte, 0, 8+len(mk))
	k = binary.BigEndian.AppendUint64(k, uint64(ns))
	return append(k, mk...)
}

func putJSON(b *bolt.Bucket, k []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", k, err)
	}
	return b.Put(k, data)
}
