package hub

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"
)

// taskTrace records a page's main-thread tasks through the DevTools
// Tracing domain, from start to stop.
type taskTrace struct {
	page *cdpPage
	done chan struct{}

	mu      sync.Mutex
	mainTid int
	tasks   []traceTask
}

// traceTask is one task of the trace: its wall time and the CPU time
// its thread spent in it (zero where the platform has no thread clock).
type traceTask struct {
	tid       int
	wall, cpu time.Duration
}

// longestTask is the longest main-thread task by each clock. The CPU
// time is what a bound can hold to on a shared machine: a task's wall
// time grows with the other processes' load, its CPU time hardly.
type longestTask struct {
	Wall, CPU time.Duration
	Tasks     int
}

// startTrace starts tracing the page's tasks. The page's own event hook,
// if any, still sees every event.
func (p *cdpPage) startTrace(ctx context.Context) (*taskTrace, error) {
	tr := &taskTrace{page: p, done: make(chan struct{})}
	p.mu.Lock()
	prev := p.onEvent
	p.onEvent = func(method string, params json.RawMessage) {
		if prev != nil {
			prev(method, params)
		}
		tr.event(method, params)
	}
	p.mu.Unlock()
	// The category of DevTools' Performance panel: "toplevel" alone has
	// no event for some tasks (a fetch's continuation that ran for a
	// second was missing).
	cfg := map[string]any{"traceConfig": map[string]any{"includedCategories": []string{"disabled-by-default-devtools.timeline", "__metadata"}}}
	return tr, p.call(ctx, "Tracing.start", cfg, nil)
}

func (tr *taskTrace) event(method string, params json.RawMessage) {
	switch method {
	case "Tracing.tracingComplete":
		close(tr.done)
	case "Tracing.dataCollected":
		var v struct {
			Value []struct {
				Name string  `json:"name"`
				Ph   string  `json:"ph"`
				Tid  int     `json:"tid"`
				Dur  float64 `json:"dur"`  // µs
				Tdur float64 `json:"tdur"` // µs of the thread's CPU
				Args struct {
					Name string `json:"name"`
				} `json:"args"`
			} `json:"value"`
		}
		if json.Unmarshal(params, &v) != nil {
			return
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		for _, e := range v.Value {
			switch {
			case e.Ph == "M" && e.Name == "thread_name" && e.Args.Name == "CrRendererMain":
				tr.mainTid = e.Tid
			case e.Ph == "X" && (e.Name == "RunTask" || e.Name == "ThreadControllerImpl::RunTask"):
				tr.tasks = append(tr.tasks, traceTask{tid: e.Tid, wall: time.Duration(e.Dur * 1e3), cpu: time.Duration(e.Tdur * 1e3)})
			}
		}
	}
}

// stop ends the trace and returns the longest task of the page's main
// thread.
func (tr *taskTrace) stop(ctx context.Context) (longestTask, error) {
	if err := tr.page.call(ctx, "Tracing.end", nil, nil); err != nil {
		return longestTask{}, err
	}
	select {
	case <-tr.done:
	case <-ctx.Done():
		return longestTask{}, ctx.Err()
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.mainTid == 0 {
		return longestTask{}, errors.New("the trace names no renderer main thread")
	}
	var l longestTask
	for _, t := range tr.tasks {
		if t.tid == tr.mainTid {
			l.Wall, l.CPU, l.Tasks = max(l.Wall, t.wall), max(l.CPU, t.cpu), l.Tasks+1
		}
	}
	return l, nil
}
