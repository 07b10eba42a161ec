package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/api"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/internal/testkit"
	"github.com/sortie-edge/sortie/store"
)

const whyScenes = `
[[scene]]
name = "quick"
mode = "parallel"
[[scene.step]]
delay = "1ms"

[[scene]]
name = "solo"
deadline = "1h"
[[scene.step]]
delay = "30m"

[[scene]]
name = "dim"
mode = "parallel"
[[scene.step]]
device = "living-light"
action = "set"
params = { brightness = { from = "level" } }
`

// TestWhyAnswersTenThousandTriggersAfterARestart sends 10,000 triggers
// (2,000 under -race) over MQTT, a fifth of which are rejected for four reasons, restarts the
// agent, and asks why of each: every one is answered with its outcome
// and reason. It reports what a trace record costs in the store.
func TestWhyAnswersTenThousandTriggersAfterARestart(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 triggers")
	}
	n := 10000
	if testkit.Race {
		n = 2000 // the race detector's pace; `go test -run TestWhyAnswers ./cmd/agent` sends all 10,000
	}
	e := newBareEnv(t, "why")
	e.scenes = filepath.Join(e.dir, "scenes")
	if err := os.MkdirAll(e.scenes, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(e.scenes, "why.toml"), whyScenes)
	e.broker = brokertest.Start(t)
	e.connect(e.broker.URL())
	e.writeConfig(fmt.Sprintf("embedded = false\nurl = %q\n", e.broker.URL()), "max_live = 0\n")
	p := e.start()

	type want struct{ outcome, reason string }
	wants := make(map[string]want, n)
	stale := time.Now().Add(-time.Hour).Format(time.RFC3339)
	start := time.Now()
	const window = 200
	for base := 0; base < n; base += window {
		var ids []string
		for i := base; i < min(base+window, n); i++ {
			id := fmt.Sprintf("w-%05d", i)
			tr := map[string]any{"scene": "quick", "request_id": id, "source": "test"}
			w := want{"accepted", ""}
			switch i % 5 {
			case 1:
				switch (i / 5) % 4 {
				case 0:
					tr["scene"], w = "nope", want{"rejected", "unknown_scene"}
				case 1:
					tr["scene"], tr["params"], w = "dim", map[string]any{"level": 1000}, want{"rejected", "invalid_param"}
				case 2:
					tr["not_after"], w = stale, want{"rejected", "deadline_passed"}
				case 3:
					tr["scene"], w = "solo", want{"rejected", "already_running"}
					if i == 16 {
						w = want{"accepted", ""} // the first run of solo
					}
				}
			}
			wants[id] = w
			b, _ := json.Marshal(tr)
			e.publish(string(b))
			ids = append(ids, id)
		}
		for _, id := range ids {
			e.reply(id)
		}
	}
	sent := time.Since(start)
	if code := p.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d on SIGTERM", code)
	}
	e.start()

	start = time.Now()
	var mu sync.Mutex
	answered, wrong := 0, 0
	var wg sync.WaitGroup
	ids := make(chan string)
	for range 4 {
		wg.Go(func() {
			for id := range ids {
				var ans api.Why
				code := e.get("/api/why/"+id, &ans)
				mu.Lock()
				w := wants[id]
				switch {
				case code != 200:
					t.Errorf("why %s: HTTP %d", id, code)
				case ans.Outcome != w.outcome || ans.Reason != w.reason:
					wrong++
					t.Errorf("why %s: %s/%s, want %s/%s", id, ans.Outcome, ans.Reason, w.outcome, w.reason)
				default:
					answered++
				}
				mu.Unlock()
			}
		})
	}
	for id := range wants {
		ids <- id
	}
	close(ids)
	wg.Wait()
	asked := time.Since(start)
	if code := e.proc.stop(t, syscall.SIGTERM); code != 0 {
		t.Fatalf("exit %d on SIGTERM", code)
	}
	db, err := store.Open(filepath.Join(e.dir, "data", "missions.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Close() }() // read only
	records, bytes, err := db.TraceStats()
	if err != nil {
		t.Fatal(err)
	}
	rejected := 0
	for _, w := range wants {
		if w.outcome == "rejected" {
			rejected++
		}
	}
	t.Logf("%d triggers (%d rejected) sent in %v; after a restart why answered %d (%.1f%%) right, %d wrong, in %v; %d trace records, %d bytes, %d B/record",
		len(wants), rejected, sent.Round(time.Millisecond), answered, 100*float64(answered)/float64(len(wants)), wrong, asked.Round(time.Millisecond),
		records, bytes, bytes/int64(max(records, 1)))
	if answered != len(wants) {
		t.Errorf("why answered %d of %d", answered, len(wants))
	}
}
