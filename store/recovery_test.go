package store_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/store"
)

// effects is an idempotent "device": it applies a step's effect at most
// once per idempotency key, recording applications in an fsync'd file
// that outlives the process, the way a real device remembers command IDs.
type effects struct {
	mu   sync.Mutex
	path string
	seen map[string]bool
	// hook runs after an effect is durable, before the step returns.
	hook func(key string)
}

func openEffects(t testing.TB, path string) *effects {
	e := &effects{path: path, seen: map[string]bool{}}
	for _, k := range readLines(t, path) {
		e.seen[k] = true
	}
	return e
}

func readLines(t testing.TB, path string) []string {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }() // read-only: nothing to lose
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); l != "" {
			out = append(out, l)
		}
	}
	return out
}

func (e *effects) Execute(ctx context.Context, req driver.StepRequest) (map[string]any, error) {
	e.mu.Lock()
	if !e.seen[req.IdempotencyKey] {
		f, err := os.OpenFile(e.path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			e.mu.Unlock()
			return nil, err
		}
		_, err = fmt.Fprintln(f, req.IdempotencyKey)
		if err == nil {
			err = f.Sync()
		}
		if err = errors.Join(err, f.Close()); err != nil {
			e.mu.Unlock()
			return nil, err
		}
		e.seen[req.IdempotencyKey] = true
	}
	hook := e.hook
	e.mu.Unlock()
	if hook != nil {
		hook(req.IdempotencyKey)
	}
	return nil, nil
}

const (
	crashMissions = 12
	crashSteps    = 4
)

// TestCrashChild is the process that gets killed. It only runs when
// TestCrashRecovery starts it.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv("SORTIE_CRASH_DIR")
	if dir == "" {
		t.Skip("run by TestCrashRecovery")
	}
	db, err := store.Open(filepath.Join(dir, "missions.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	eff := openEffects(t, filepath.Join(dir, "effects"))
	var once sync.Once
	n := 0
	eff.hook = func(string) {
		eff.mu.Lock()
		n++
		reached := n >= crashMissions*crashSteps/2
		eff.mu.Unlock()
		if reached {
			// Tell the parent we are mid-step (effect applied, outcome not
			// yet saved), then wait to be killed.
			once.Do(func() {
				if err := os.WriteFile(filepath.Join(dir, "mid-step"), nil, 0o600); err != nil {
					panic(err) // the parent sees the child exit early
				}
			})
			select {}
		}
	}
	d, err := driver.New(driver.Options{Store: db, Handlers: map[string]driver.Handler{"effect": eff}, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	// Submit everything before the loop starts, so the kill cannot come
	// before every mission is stored.
	for i := range crashMissions {
		var steps []driver.Step
		for j := range crashSteps {
			steps = append(steps, driver.Step{ID: fmt.Sprintf("s%d", j), Kind: "effect"})
		}
		if _, _, err := d.Submit(context.Background(), driver.Spec{Type: "crash", Steps: steps, RequestKey: fmt.Sprintf("req-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {} // killed by the parent
}

// TestCrashRecovery kills a process running missions with SIGKILL in the
// middle of steps, reopens the store in this process, and checks that
// every mission completes with every step's effect applied exactly once.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.v")
	cmd.Env = append(os.Environ(), "SORTIE_CRASH_DIR="+dir)
	out := new(strings.Builder)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Wait for the child to report it is mid-step. A file appearing is the
	// event; polling its existence is bounded and needs no sleep to be
	// correct, only to be cheap.
	deadline := time.After(60 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "mid-step")); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("child exited early: %v\n%s", err, out)
		case <-deadline:
			t.Fatalf("child never reached mid-step (kill: %v)\n%s", cmd.Process.Kill(), out)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := <-exited; err == nil {
		t.Fatal("the child exited cleanly after SIGKILL")
	}

	db, err := store.Open(filepath.Join(dir, "missions.db"), store.Options{})
	if err != nil {
		t.Fatalf("reopen after SIGKILL: %v", err)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Error(err)
		}
	}()
	before := len(readLines(t, filepath.Join(dir, "effects")))
	active, err := db.Active(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stepRunning := 0
	for _, m := range active {
		if m.State == driver.StateStepRunning {
			stepRunning++
		}
	}
	if stepRunning == 0 {
		t.Fatalf("no mission was left STEP_RUNNING by the crash (%d active)", len(active))
	}
	eff := openEffects(t, filepath.Join(dir, "effects"))
	done := make(chan struct{}, crashMissions)
	d, err := driver.New(driver.Options{
		Store: db, Handlers: map[string]driver.Handler{"effect": eff}, Workers: 4,
		Observers: []driver.Observer{driver.ObserverFunc(func(ev driver.Event, m *driver.Mission) {
			if ev.To.Terminal() {
				done <- struct{}{}
			}
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(context.Background()); err != nil {
			t.Error(err)
		}
	}()
	for range active {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("recovered missions did not finish")
		}
	}
	ms, _, err := db.List(context.Background(), driver.Filter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != crashMissions {
		t.Fatalf("%d missions stored, want %d", len(ms), crashMissions)
	}
	recovered := 0
	for _, m := range ms {
		if m.State != driver.StateSucceeded {
			t.Errorf("mission %s: %s %s", m.ID, m.State, m.Error)
		}
		evs, err := db.Timeline(context.Background(), m.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Input == driver.InRecover {
				recovered++
			}
		}
	}
	if recovered < stepRunning {
		t.Errorf("%d recoveries on timelines, want at least %d", recovered, stepRunning)
	}
	lines := readLines(t, filepath.Join(dir, "effects"))
	count := map[string]int{}
	for _, k := range lines {
		count[k]++
	}
	if len(count) != crashMissions*crashSteps {
		t.Errorf("%d distinct effects, want %d", len(count), crashMissions*crashSteps)
	}
	for k, n := range count {
		if n != 1 {
			t.Errorf("effect %s applied %d times", k, n)
		}
	}
	t.Logf("killed mid-step with %d effects applied and %d missions STEP_RUNNING; recovered %d steps", before, stepRunning, recovered)
}
