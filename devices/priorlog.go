package devices

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"github.com/sortie-edge/sortie/internal/fifo"
)

// PriorLog keeps, in a file, the state a device of another ecosystem
// was in before a step's first command to it, so that the step's undo
// restores it even when the agent was killed while the step was in
// flight. A native device's ack carries its prior state; these devices
// say nothing of it, and the state the command handler took at the
// first attempt (HandlerOptions.PriorLog) would otherwise die with the
// process: a recovered step would take the device's state after the
// command, and its undo would leave the device as the mission left it.
//
// The file is appended without fsync: a process killed keeps what the
// kernel has, a power cut may lose the last entries (their undo then
// leaves the device as it is, as without the log). It holds at most
// twice the entries kept, and is rewritten from those when it reaches
// that. Safe for concurrent use.
type PriorLog struct {
	mu      sync.Mutex
	path    string
	f       *os.File
	entries *fifo.Map[string, map[string]any]
	lines   int
	max     int
}

// priorEntry is one line of the file.
type priorEntry struct {
	Key   string         `json:"k"`
	State map[string]any `json:"s"`
}

// OpenPriorLog opens (or creates) the log at path, keeping the last max
// entries (1024 when max is not positive). A torn or unreadable line, as
// a kill in the middle of an append leaves, is skipped.
func OpenPriorLog(path string, max int) (*PriorLog, error) {
	if max <= 0 {
		max = 1024
	}
	l := &PriorLog{path: path, entries: fifo.New[string, map[string]any](max), max: max}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("prior log: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// A scan error (a line beyond 1 MiB, which Put never writes)
		// ends the reading: what was read is kept.
		var e priorEntry
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		if d.Decode(&e) != nil || e.Key == "" || e.State == nil {
			continue
		}
		l.entries.Put(e.Key, normalizePrior(e.State))
	}
	if err := l.rewrite(); err != nil {
		return nil, err
	}
	return l, nil
}

// normalizePrior gives numbers read back from the file the kinds the
// client reports (int64 or float64), as normalizeOwned does for acks.
func normalizePrior(st map[string]any) map[string]any {
	for k, v := range st {
		if n, ok := v.(json.Number); ok {
			if i, err := n.Int64(); err == nil {
				st[k] = i
			} else if f, err := n.Float64(); err == nil {
				st[k] = f
			}
		}
	}
	return st
}

// Get returns the prior state logged under key.
func (l *PriorLog) Get(key string) (map[string]any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.entries.Get(key)
}

// Put logs the prior state of the step whose idempotency key is key.
func (l *PriorLog) Put(key string, st map[string]any) error {
	line, err := json.Marshal(priorEntry{Key: key, State: st})
	if err != nil {
		return fmt.Errorf("prior log: %w", err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries.Put(key, maps.Clone(st)) // the caller's map goes on into acks and outputs
	if l.f == nil {
		return errors.New("prior log: closed")
	}
	if _, err := l.f.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("prior log: %w", err)
	}
	if l.lines++; l.lines >= 2*l.max {
		return l.rewrite()
	}
	return nil
}

// rewrite writes the file anew from the entries kept. Caller holds mu,
// or l is not shared yet.
func (l *PriorLog) rewrite() error {
	var b bytes.Buffer
	n := 0
	for k, st := range l.entries.All() {
		line, err := json.Marshal(priorEntry{Key: k, State: st})
		if err != nil {
			continue
		}
		b.Write(line)
		b.WriteByte('\n')
		n++
	}
	// Synced, unlike the appends: a power cut during a rewrite must not
	// leave an empty file in place of every entry.
	tmp := l.path + ".tmp"
	if err := writeSynced(tmp, b.Bytes()); err != nil {
		return fmt.Errorf("prior log: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("prior log: %w", err)
	}
	if d, err := os.Open(filepath.Dir(l.path)); err == nil {
		_ = d.Sync() // the rename's durability: best effort, as the appends are
		_ = d.Close()
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("prior log: %w", err)
	}
	if l.f != nil {
		_ = l.f.Close() // replaced by the file renamed over it
	}
	l.f, l.lines = f, n
	return nil
}

// Close closes the file.
func (l *PriorLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}

// writeSynced writes data to a new file at path and syncs it.
func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}
