package devices

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
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
	l.entries.Put(key, st)
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
	tmp := l.path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("prior log: %w", err)
	}
	if err := os.Rename(tmp, l.path); err != nil {
		return fmt.Errorf("prior log: %w", err)
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
