package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store/internal/wal"
)

// Schema is the layout version this build writes. Open migrates older
// files through the migrations table and rejects newer ones.
const Schema = 2

// allocSize is how far ahead of its data bbolt grows the file once the
// file is past it (below it, to the next power of two). bbolt's 16 MiB
// default would make a gateway's 17 MiB of missions a 32 MiB file.
const allocSize = 1 << 20

// DefaultTimeout is how long Open waits for the file lock by default.
const DefaultTimeout = time.Second

// Sentinel errors returned by Open and by reads of damaged records. Missing
// missions and stale saves are reported with driver.ErrNotFound and
// driver.ErrConflict so callers need only the driver's vocabulary.
var (
	// ErrLocked means another DB, in this process or another, holds the
	// file and did not release it within Options.Timeout.
	ErrLocked = errors.New("store file is locked")
	// ErrCorrupt means the file or one of its records cannot be read.
	ErrCorrupt = errors.New("store file is corrupt")
	// ErrSchema means the file was written by a newer build, or is not a
	// Sortie store at all.
	ErrSchema = errors.New("unsupported store schema")
	// ErrCursor means a List cursor was not one List returned.
	ErrCursor = errors.New("invalid list cursor")
	// ErrForeignLog means the write-ahead log beside the file was written
	// for another store file (one restored from a backup, say): replaying
	// it would apply another file's writes.
	ErrForeignLog = wal.ErrForeign
)

// Options configures Open. The zero value is usable.
type Options struct {
	// Timeout bounds the wait for the file lock held by another DB.
	// Zero or negative means DefaultTimeout: waiting forever would turn a
	// second agent on the same file into a silent hang.
	Timeout time.Duration
	// Logger receives migration and prune reports; nil discards them.
	Logger *slog.Logger
	// Mode is the permission of a newly created file; zero means 0600.
	Mode os.FileMode
	// Outbox makes every committed event also an entry of the outbox
	// bucket, in the same transaction, for the hub sync to forward (see
	// (*DB).Outbox). Off, it costs nothing.
	Outbox bool
	// OutboxMax bounds the outbox: past it, entries are compacted to the
	// latest per mission. Zero means DefaultOutboxMax; negative, unbounded.
	OutboxMax int
	// CheckpointDelay is how long logged writes wait, at most, before a
	// background checkpoint applies them to the file (sooner when
	// checkpointBatch of them gather, or a read needs them there). Zero
	// means DefaultCheckpointDelay.
	CheckpointDelay time.Duration

	// OnCommit, when set, is told how long each group commit took, from
	// its leader taking the write lock to its log append being durable
	// (the fsync included), before the writes it carried return. It is
	// what a mission's transition waits for.
	OnCommit func(took time.Duration)
	// OnCheckpoint, when set, is told how long each checkpoint's bbolt
	// transaction took to apply logged writes to the file (its commit and
	// fsyncs included).
	OnCheckpoint func(took time.Duration)
	// OnPrune, when set, is told how many finished missions in state
	// Prune or PruneBytes deleted, once the transaction that deleted
	// them has committed.
	//
	// The three are for metrics. They run on the goroutine that wrote,
	// with the store's locks held: they must return at once and not call
	// the DB.
	OnPrune func(state driver.State, n int)

	// logFS is the file system of the write-ahead log; nil means wal.OS.
	// Power-cut tests put a crashfs.FS here, with a smaller logPrealloc
	// than wal.Prealloc (zero), and set boltNoSync and boltNoGrowSync:
	// they copy the bbolt file as of the cut rather than rely on its
	// fsyncs. Tests of what the store keeps and how big its file grows
	// (not of what survives a power cut) put a log without syncs here and
	// set boltNoSync alone, so that the file grows as on a gateway.
	logFS          wal.FS
	logPrealloc    int
	boltNoSync     bool
	boltNoGrowSync bool
}

// DefaultCheckpointDelay lets a checkpoint carry the steps of several
// seconds: each one rewrites the pages of every bucket it touches, so at
// a home's pace of a step or two a second a short delay would write a
// dozen pages of flash per step. Writes are durable in the log
// meanwhile, and reads that need them in the file checkpoint first.
const DefaultCheckpointDelay = 10 * time.Second

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Mode == 0 {
		o.Mode = 0o600
	}
	if o.OutboxMax == 0 {
		o.OutboxMax = DefaultOutboxMax
	}
	if o.CheckpointDelay <= 0 {
		o.CheckpointDelay = DefaultCheckpointDelay
	}
	if o.OnCommit == nil {
		o.OnCommit = func(time.Duration) {}
	}
	if o.OnCheckpoint == nil {
		o.OnCheckpoint = func(time.Duration) {}
	}
	if o.OnPrune == nil {
		o.OnPrune = func(driver.State, int) {}
	}
	if o.logFS == nil {
		o.logFS = wal.OS
	}
	if o.logPrealloc == 0 {
		o.logPrealloc = wal.Prealloc
	}
	return o
}

// Bucket names; see the package documentation for their contents.
var (
	bMeta     = []byte("meta")
	bMissions = []byte("missions")
	bLive     = []byte("live")
	bOrder    = []byte("order")
	bActive   = []byte("active")
	bRequests = []byte("requests")
	bFinished = []byte("finished")
	bTimeline = []byte("timeline")
	bOutbox   = []byte("outbox")

	allBuckets = [][]byte{bMeta, bMissions, bLive, bOrder, bActive, bRequests, bFinished, bTimeline, bOutbox, bTraces, bTraceAge, bSchedules, bTraceLog, bControls}

	kSchema = []byte("schema")
)

// DB is a mission store in one bbolt file. It implements driver.Store.
type DB struct {
	bolt  *bolt.DB
	path  string
	log   *slog.Logger
	logFS wal.FS // the write-ahead log's file system

	// The five locks, in the order lockorder.go gives and checks.
	//
	// gate is held shared by every call (enter) and exclusively by
	// Reclaim, which replaces bolt; the checkpointer, the other user of
	// bolt, is kept out by ckMu.
	gate     rwMutex
	mu       mutex
	queue    []*write // writes waiting for the next commit
	leading  bool     // a leader is committing or has been promoted
	closed   bool
	inflight sync.WaitGroup // calls that Close must wait for

	// commitErr and checkpointErr are the failures of the last commit and
	// the last checkpoint, each nil once one of its kind succeeds again
	// (WriteError).
	commitErr, checkpointErr atomic.Pointer[error]

	commits     atomic.Uint64 // log appends of commitBatch
	writes      atomic.Uint64 // Create and Save calls they carried
	checkpoints atomic.Uint64 // bbolt transactions applying them

	// wmu orders everything that decides against the acknowledged state:
	// the commit leader's checks and log append, and Prune, which must not
	// delete a mission between a save's check and its checkpoint.
	wmu mutex
	wal logWriter // appended under wmu
	// enc is the scratch buffer a commit encodes its writes into, under
	// wmu: the log copies them, so it is reused rather than allocated per
	// write.
	enc  []byte
	ovMu mutex
	ov   overlay
	ckMu mutex // one checkpoint at a time

	obSeq uint64 // last outbox seq assigned; under wmu
	// outboxID is OutboxID: the store's WAL ID, which a copy renews.
	outboxID string

	// onCommit, onCheckpoint and onPrune are Options'; never nil.
	onCommit, onCheckpoint func(time.Duration)
	onPrune                func(driver.State, int)

	ckDelay time.Duration
	ckKick  chan int
	ckStop  chan struct{}
	ckDone  chan struct{}

	ob outbox
}

var _ driver.Store = (*DB)(nil)

// Open opens or creates the store at path, creating its buckets and
// migrating an older layout. It fails with ErrLocked if another DB holds
// the file for longer than opts.Timeout, with ErrCorrupt if the file is
// not a readable bbolt file, and with ErrSchema if a newer build wrote it.
func Open(path string, opts Options) (*DB, error) {
	opts = opts.withDefaults()
	bdb, err := openBolt(path, opts)
	if err != nil {
		return nil, err
	}
	sweepTemps(path, opts.Logger)
	db := &DB{
		bolt: bdb, path: path, log: opts.Logger.With("store", path), logFS: opts.logFS,
		ov:       overlay{missions: map[string]*pendingMission{}, requests: map[string]pendingRequest{}},
		ckDelay:  opts.CheckpointDelay,
		onCommit: opts.OnCommit, onCheckpoint: opts.OnCheckpoint, onPrune: opts.OnPrune,
		ckKick: make(chan int, 1), ckStop: make(chan struct{}), ckDone: make(chan struct{}),
	}
	db.gate.rank, db.wmu.rank, db.ckMu.rank, db.ovMu.rank, db.mu.rank = rankGate, rankW, rankCk, rankOv, rankMu
	if err := db.openWAL(opts); err != nil {
		_ = bdb.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	go db.checkpointer()
	db.openOutbox(opts)
	return db, nil
}

// openWAL replays what a crash left in the log, prepares the file
// (schema, buckets, migrations) and starts a fresh log.
func (db *DB) openWAL(opts Options) (err error) {
	defer func() {
		// bbolt panics on some damaged pages the first read touches.
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrCorrupt, r)
		}
	}()
	// Migrations first: log records are missions and events, not pages,
	// so a log written by an older build replays into the new layout.
	if err := db.init(); err != nil {
		return err
	}
	last, err := db.replayWAL()
	if err != nil {
		return err
	}
	var id uint64
	_ = db.bolt.View(func(tx *bolt.Tx) error {
		id, _ = walMeta(tx)
		return nil
	})
	db.ov.applied = last
	l, err := wal.CreateOn(db.logFS, wal.Path(db.path), id, last, opts.Mode, opts.logPrealloc)
	if err != nil {
		return err
	}
	db.wal = l
	return nil
}

// openBolt turns bbolt's failures, including panics on damaged files,
// into errors that name the file.
// lockedHook, when set (by tests), runs once openBolt holds a file's
// lock, before it checks that the file is still the one at its path: the
// moment a restore's swap can come between.
var lockedHook func(path string)

func openBolt(path string, opts Options) (*bolt.DB, error) {
	for range 3 {
		bdb, file, err := openBoltOnce(path, opts)
		if err != nil {
			return nil, err
		}
		if lockedHook != nil {
			lockedHook(path)
		}
		// A restore (Restore) may have put another file at path while we
		// waited for the lock of the one we opened: that one is the old
		// database, kept under another name.
		if now, err := os.Stat(path); err == nil {
			if was, err := file.Stat(); err == nil && !os.SameFile(now, was) {
				_ = bdb.Close()
				continue
			}
		}
		return bdb, nil
	}
	return nil, fmt.Errorf("open store %s: the file kept being replaced while it was opened", path)
}

func openBoltOnce(path string, opts Options) (bdb *bolt.DB, file *os.File, err error) {
	defer func() {
		if r := recover(); r != nil {
			// bbolt's mapping of the file leaks: it has no handle to unmap.
			if file != nil {
				unlockFile(file)
				_ = file.Close()
			}
			bdb, err = nil, fmt.Errorf("open store %s: %w: %v", path, ErrCorrupt, r)
		}
	}()
	bdb, err = bolt.Open(path, opts.Mode, &bolt.Options{
		Timeout:      opts.Timeout,
		FreelistType: bolt.FreelistMapType,
		NoSync:       opts.boltNoSync,
		NoGrowSync:   opts.boltNoGrowSync,
		// NoFreelistSync would save a page per commit, but then Open rebuilds
		// the freelist in a goroutine of bbolt's whose panic on a damaged
		// file no recover can catch.
		OpenFile: func(name string, flag int, mode os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, mode)
			file = f
			return f, err
		},
	})
	switch {
	case err == nil:
		bdb.AllocSize = allocSize
		return bdb, file, nil
	case errors.Is(err, berrors.ErrTimeout):
		return nil, nil, fmt.Errorf("open store %s: %w: another agent, or another open store in this process, held it for %s", path, ErrLocked, opts.Timeout)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
		errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping):
		return nil, nil, fmt.Errorf("open store %s: %w: %w", path, ErrCorrupt, err)
	default:
		return nil, nil, fmt.Errorf("open store %s: %w", path, err)
	}
}

// init checks the layout version, creates buckets and runs migrations,
// each in its own transactions, recording the schema each reaches: a
// failed migration leaves the file at the schema before it, and the next
// Open runs it again (a batched one from where it stopped). A file left
// mid-way through a batched migration holds records of both layouts:
// only this build or a newer one reads it.
func (db *DB) init() (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %v", ErrCorrupt, r)
		}
	}()
	// A file already in this build's layout is only read: its open then
	// costs no commit (two fdatasyncs), a good part of the agent's
	// start-up on a gateway's flash.
	current := false
	_ = db.bolt.View(func(tx *bolt.Tx) error {
		current = inLayout(tx)
		return nil
	})
	if current {
		return nil
	}
	var from int
	err = db.bolt.Update(func(tx *bolt.Tx) error {
		if from, err = schemaOf(tx); err != nil {
			return err
		}
		if from > Schema {
			return fmt.Errorf("%w: file has schema %d, newer than this build's %d; run a newer sortie or move the file aside", ErrSchema, from, Schema)
		}
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		if err := ensureWALID(tx); err != nil {
			return err
		}
		return tx.Bucket(bMeta).Put(kSchema, be64(uint64(from)))
	})
	if err != nil {
		return err
	}
	for v := from; v < Schema; v++ {
		mig := migrations[v]
		db.log.Info("migrating store", "from", v, "to", v+1, "step", mig.name)
		if mig.batched != nil {
			err = mig.batched(db.bolt)
		}
		if err == nil {
			err = db.bolt.Update(func(tx *bolt.Tx) error {
				if mig.apply != nil {
					if err := mig.apply(tx); err != nil {
						return err
					}
				}
				return tx.Bucket(bMeta).Put(kSchema, be64(uint64(v+1)))
			})
		}
		if err != nil {
			return fmt.Errorf("migrate schema %d to %d (%s): %w", v, v+1, mig.name, err)
		}
	}
	return nil
}

// inLayout reports whether the file needs nothing from init: this
// build's schema, every bucket, and a WAL ID.
func inLayout(tx *bolt.Tx) bool {
	if from, err := schemaOf(tx); err != nil || from != Schema || tx.Bucket(bMeta) == nil {
		return false
	}
	for _, name := range allBuckets {
		if tx.Bucket(name) == nil {
			return false
		}
	}
	id, _ := walMeta(tx)
	return id != 0
}

// schemaOf reports the layout version of the file. A file without a meta
// bucket is either new (no buckets: the current schema) or from before
// schema tracking (a missions bucket: schema 0).
func schemaOf(tx *bolt.Tx) (int, error) {
	if meta := tx.Bucket(bMeta); meta != nil {
		v := meta.Get(kSchema)
		if len(v) != 8 {
			return 0, fmt.Errorf("%w: meta schema is %d bytes, want 8", ErrCorrupt, len(v))
		}
		n := binary.BigEndian.Uint64(v)
		if n > 1<<20 {
			return 0, fmt.Errorf("%w: file has schema %d, newer than this build's %d", ErrSchema, n, Schema)
		}
		return int(n), nil
	}
	if tx.Bucket(bMissions) != nil {
		return 0, nil
	}
	var other []byte
	_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		if other == nil {
			other = bytes.Clone(name)
		}
		return nil
	})
	if other != nil {
		return 0, fmt.Errorf("%w: not a sortie store (it has bucket %q and no meta)", ErrSchema, other)
	}
	return Schema, nil
}

// Path returns the file the DB was opened on.
func (db *DB) Path() string { return db.path }

// Close waits for queued writes to commit, applies the log to the file
// and marks the log clean (kept for the next Open), then closes the file
// and releases its lock. Closing
// twice is harmless.
func (db *DB) Close() error {
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return nil
	}
	db.closed = true
	db.mu.Unlock()
	db.inflight.Wait()
	db.ob.bg.Wait() // a compaction stops at its next transaction
	close(db.ckStop)
	<-db.ckDone
	// A failed checkpoint leaves the log in place for the next Open.
	ckErr := db.checkpoint()
	walErr := db.wal.Close(ckErr == nil)
	if err := db.bolt.Close(); err != nil {
		return fmt.Errorf("close store %s: %w", db.path, err)
	}
	if err := errors.Join(ckErr, walErr); err != nil {
		return fmt.Errorf("close store %s: %w", db.path, err)
	}
	return nil
}

// enter registers a call that Close must wait for, and that Reclaim
// must not swap the file under; leave ends it.
func (db *DB) enter() error {
	db.gate.RLock()
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.closed {
		db.gate.RUnlock()
		return fmt.Errorf("store %s: %w", db.path, driver.ErrClosed)
	}
	db.inflight.Add(1)
	return nil
}

func (db *DB) leave() {
	db.inflight.Done()
	db.gate.RUnlock()
}

// view runs fn in a read transaction, unless the DB is closed.
func (db *DB) view(fn func(tx *bolt.Tx) error) error {
	if err := db.enter(); err != nil {
		return err
	}
	defer db.leave()
	return db.bolt.View(fn)
}

// scan is view for reads that walk bbolt's buckets (lists, timelines,
// the outbox, counts): it checkpoints first, so they see every
// acknowledged write.
func (db *DB) scan(fn func(tx *bolt.Tx) error) error {
	if err := db.enter(); err != nil {
		return err
	}
	defer db.leave()
	if err := db.checkpoint(); err != nil {
		return err
	}
	return db.bolt.View(fn)
}

func be64(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

// timelineKey is the mission ID, a zero byte (which driver.ValidateID
// keeps out of IDs, so one ID's events never run into another's whose ID
// it prefixes) and the event seq.
func timelineKey(id string, seq uint64) []byte {
	k := make([]byte, 0, len(id)+9)
	k = append(k, id...)
	k = append(k, 0)
	return binary.BigEndian.AppendUint64(k, seq)
}

func timelinePrefix(id string) []byte {
	return append([]byte(id), 0)
}

// finishedKey orders terminal missions by finish time for Prune.
func finishedKey(finished uint64, id string) []byte {
	k := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(id)), finished)
	return append(k, id...)
}
