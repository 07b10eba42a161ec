package devices_test

import (
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker"
	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
	"github.com/sortie-edge/sortie/driver"
)

// rig is a broker, a client and the device handlers over the shipped home.
type rig struct {
	broker *broker.Broker
	client *devices.Client
	h      *devices.Handlers
	kinds  map[string]driver.Handler
	wakes  *wakes
}

func newRig(t *testing.T, opts devices.HandlerOptions) *rig {
	t.Helper()
	b := brokertest.Start(t)
	w := newWakes()
	c := dial(t, b, func(o *devices.Options) { o.OnChange = w.wake })
	h := devices.NewHandlers(c, loadHome(t), opts)
	r := &rig{broker: b, client: c, h: h, kinds: map[string]driver.Handler{}, wakes: w}
	h.Register(func(kind string, x driver.Handler) { r.kinds[kind] = x })
	return r
}

// wakes stands in for the driver's Wake: it remembers each key's wakes,
// so a run can wait for the one its parked attempt names, even if it
// came before the attempt parked.
type wakes struct {
	mu    sync.Mutex
	count map[string]int // wakes of each key
	used  map[string]int // of those, the ones an attempt resumed on
	ch    chan struct{}  // closed and replaced at every wake
}

func newWakes() *wakes {
	return &wakes{count: map[string]int{}, used: map[string]int{}, ch: make(chan struct{})}
}

func (w *wakes) wake(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.count[key]++
	close(w.ch)
	w.ch = make(chan struct{})
}

// await waits for a wake of key not used yet, and reports true, or
// until, and reports false.
func (w *wakes) await(key string, until time.Time) bool {
	timer := time.NewTimer(time.Until(until))
	defer timer.Stop()
	for {
		w.mu.Lock()
		n, ch := w.count[key], w.ch
		if key != "" && n > w.used[key] {
			w.used[key] = n
			w.mu.Unlock()
			return true
		}
		w.mu.Unlock()
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// device starts a fake device and waits until the client has its state.
func (r *rig) device(t *testing.T, id string, state map[string]any, script func(wire.Command, int) reply) *fakeDevice {
	t.Helper()
	d := startDevice(t, r.broker, id, state, script)
	waitUntil(t, r.client, id, "first state", func() bool { _, ok := r.client.State(id); return ok })
	return d
}

// run executes an attempt as the driver does: a handler that parks
// (driver.Pending) is called again with Resume set once its key is woken
// (a wake that came while it was still returning counts) or its time has
// come.
func (r *rig) run(t testing.TB, kind string, req driver.StepRequest) (map[string]any, error) {
	t.Helper()
	h := r.kinds[kind]
	if h == nil {
		t.Fatalf("no handler for %s", kind)
	}
	since := time.Now()
	for range 1000 {
		out, err := h.Execute(t.Context(), req)
		var pe *driver.PendingError
		if !errors.As(err, &pe) {
			return out, err
		}
		woken := r.wakes.await(pe.Key, pe.Until)
		req.Resume = &driver.Parked{Key: pe.Key, Until: pe.Until, Note: pe.Note, Out: pe.Out, Since: since, Woken: woken}
	}
	t.Fatal("the handler never stopped parking")
	return nil, nil
}

func stepReq(t *testing.T, key string, attempt int, params any) driver.StepRequest {
	t.Helper()
	raw, err := json.Marshal(params)
	if err != nil {
		t.Fatal(err)
	}
	return driver.StepRequest{
		MissionID: "m1", StepID: "s1", IdempotencyKey: key, Attempt: attempt, Params: raw,
		TraceID: "trace-1", Started: time.Now(), Deadline: time.Now().Add(5 * time.Second),
	}
}

func wantClass(t *testing.T, err error, class driver.Class, code string) {
	t.Helper()
	gotClass, gotCode := driver.Classify(err)
	if err == nil || gotClass != class || gotCode != code {
		t.Fatalf("err = %v (class %v, code %q), want class %v code %q", err, gotClass, gotCode, class, code)
	}
}

var lightOff = map[string]any{"power": "off", "brightness": 0, "color_temp": 2700}

func TestCommandVerified(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	dev := r.device(t, "living-light", lightOff, nil)
	out, err := r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 1, map[string]any{
		"device": "living-light", "action": "turn_on", "params": map[string]any{"brightness": 40}, "verify": true,
	}))
	if err != nil {
		t.Fatalf("Execute: %v", err)
	}
	prior, _ := out["prior_state"].(map[string]any)
	state, _ := out["state"].(map[string]any)
	if prior["power"] != "off" || state["power"] != "on" || state["brightness"] != int64(40) || out["verified"] != true {
		t.Errorf("outputs = %v", out)
	}
	if out["command_id"] != "m1.s1" || dev.effectCount("m1.s1") != 1 {
		t.Errorf("command id %v, effects %d", out["command_id"], dev.effectCount("m1.s1"))
	}
	cmd := dev.next(t)
	if cmd.TraceID != "trace-1" || cmd.Attempt != 1 {
		t.Errorf("command = %+v, want trace and attempt passed through", cmd)
	}
}

func TestCommandVerifyFailed(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	r.device(t, "front-door", map[string]any{"locked": false}, func(wire.Command, int) reply { return reply{Stuck: true} })
	_, err := r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 1, map[string]any{
		"device": "front-door", "action": "lock", "verify": true, "verify_timeout": "150ms",
	}))
	wantClass(t, err, driver.Permanent, devices.CodeVerifyFailed)
	// The states as devices report them, not as Go prints maps.
	if want := `reported {"locked":false}, not {"locked":true}`; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

func TestCommandRejectedBeforePublish(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	r.device(t, "living-ac", map[string]any{"power": "off"}, nil)
	for _, tc := range []struct {
		name   string
		params any
		code   string
	}{
		{"above max", map[string]any{"device": "living-ac", "action": "set", "params": map[string]any{"target": 35}}, wire.CodeInvalidParam},
		{"unknown action", map[string]any{"device": "living-ac", "action": "fly"}, wire.CodeUnknownAction},
		{"unknown device", map[string]any{"device": "garage", "action": "open"}, devices.CodeUnknownDevice},
		{"wildcard device", map[string]any{"device": "living-ac/#", "action": "set"}, devices.CodeUnknownDevice},
		{"misspelt key", map[string]any{"device": "living-ac", "action": "set", "verfy": true}, devices.CodeBadStep},
		{"bad duration", map[string]any{"device": "living-ac", "action": "set", "ack_timeout": "soon"}, devices.CodeBadStep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.run(t, devices.KindCommand, stepReq(t, "k-"+tc.name, 1, tc.params))
			wantClass(t, err, driver.Permanent, tc.code)
		})
	}
	_, err := r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 1, map[string]any{"device": "living-ac", "action": "set", "params": map[string]any{"target": 35}}))
	if want := "target: 35 is above max 30"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("err = %v, want it to name the field: %q", err, want)
	}
	if s := r.client.Stats(); s.Sent != 0 {
		t.Errorf("published %d commands, want none", s.Sent)
	}
}

func TestCommandDeviceErrors(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	jammed := r.device(t, "front-door", map[string]any{"locked": false}, func(wire.Command, int) reply { return reply{Code: wire.CodeJammed} })
	r.device(t, "bedroom-curtain", map[string]any{"position": 0, "moving": false}, func(wire.Command, int) reply { return reply{Code: wire.CodeBusy} })

	_, err := r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 1, map[string]any{"device": "front-door", "action": "lock"}))
	wantClass(t, err, driver.Permanent, wire.CodeJammed)
	// People read the device's name and room first; the command ID is
	// there for whoever greps the device's log.
	if want := "Front door lock (hall): scripted (command m1.s1)"; err.Error() != want {
		t.Errorf("error = %q, want %q", err, want)
	}
	if got := jammed.receivedCount("m1.s1"); got != 1 {
		t.Errorf("published %d times, want 1", got)
	}
	_, err = r.run(t, devices.KindCommand, stepReq(t, "m1.s2", 1, map[string]any{"device": "bedroom-curtain", "action": "open"}))
	wantClass(t, err, driver.Retryable, wire.CodeBusy)
}

func TestCommandLostAckRetry(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	dev := r.device(t, "living-light", lightOff, func(_ wire.Command, n int) reply { return reply{Drop: n == 1, NoPrior: true} })
	params := map[string]any{"device": "living-light", "action": "turn_on", "ack_timeout": "150ms"}
	_, err := r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 1, params))
	wantClass(t, err, driver.Retryable, devices.CodeAckTimeout)
	// By now the device may have reported its new state; the prior state
	// must still be the one from before the first attempt.
	waitUntil(t, r.client, "living-light", "power on", func() bool { st, _ := r.client.State("living-light"); return st["power"] == "on" })
	out, err := r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 2, params))
	if err != nil {
		t.Fatalf("retry: %v", err)
	}
	prior := out["prior_state"].(map[string]any)
	if prior["power"] != "off" {
		t.Errorf("prior_state = %v, want the state before the first attempt", prior)
	}
	// Outputs are the step's own: changing them does not change what the
	// next attempt remembers.
	prior["power"] = "changed by the caller"
	if out, err = r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 3, params)); err != nil {
		t.Fatalf("third attempt: %v", err)
	}
	if prior := out["prior_state"].(map[string]any); prior["power"] != "off" {
		t.Errorf("third attempt: prior_state = %v, want the remembered one", prior)
	}
	if got := dev.effectCount("m1.s1"); got != 1 {
		t.Errorf("applied %d times, want once", got)
	}
}

func TestCommandOffline(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{OfflineRetry: 3 * time.Second})
	dev := r.device(t, "living-light", lightOff, nil)
	dev.setOnline(false)
	waitUntil(t, r.client, "living-light", "offline", func() bool { return !r.client.Available("living-light") })

	req := stepReq(t, "m1.s1", 1, map[string]any{"device": "living-light", "action": "turn_on"})
	_, err := r.run(t, devices.KindCommand, req)
	wantClass(t, err, driver.NotReady, devices.CodeDeviceOffline)
	var se *driver.StepError
	if errors.As(err, &se) && se.RetryAfter != 3*time.Second {
		t.Errorf("retry after %v, want 3s", se.RetryAfter)
	}
	if s := r.client.Stats(); s.Sent != 0 {
		t.Errorf("published %d commands to an offline device", s.Sent)
	}
	dev.setOnline(true)
	waitUntil(t, r.client, "living-light", "online", func() bool { return r.client.Available("living-light") })
	if _, err := r.run(t, devices.KindCommand, req); err != nil {
		t.Fatalf("after coming online: %v", err)
	}
	if dev.effectCount("m1.s1") != 1 {
		t.Error("command not applied after the device came back")
	}
}

func TestRestore(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	dev := r.device(t, "living-ac", map[string]any{"power": "off", "mode": "auto", "target": 24, "fan": "auto"}, nil)
	out, err := r.run(t, devices.KindCommand, stepReq(t, "m1.s1", 1, map[string]any{
		"device": "living-ac", "action": "set", "params": map[string]any{"power": "on", "mode": "cool", "target": 20}, "verify": true,
	}))
	if err != nil {
		t.Fatal(err)
	}
	// The driver stores outputs as JSON; hand them back the way it reads them.
	var fwd map[string]any
	b, _ := json.Marshal(out)
	if err := json.Unmarshal(b, &fwd); err != nil {
		t.Fatal(err)
	}
	req := stepReq(t, "m1.s1.undo", 1, nil)
	req.Compensating, req.Forward = true, fwd
	req.Params = json.RawMessage(`{"verify": true}`)
	res, err := r.run(t, devices.KindRestore, req)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	st, _ := r.client.State("living-ac")
	if res["restored"] != true || st["power"] != "off" || st["mode"] != "auto" || st["target"] != int64(24) {
		t.Errorf("restore outputs %v, state %v", res, st)
	}
	if dev.effectCount("m1.s1.undo") != 1 || dev.effectCount("m1.s1") != 1 {
		t.Error("each command must be applied once under its own ID")
	}

	// Nothing known: nothing sent.
	sent := r.client.Stats().Sent
	req.IdempotencyKey = "m1.s2.undo"
	req.Forward = map[string]any{"device": "living-ac"}
	res, err = r.run(t, devices.KindRestore, req)
	if err != nil || res["restored"] != false {
		t.Fatalf("restore without prior: %v, %v", res, err)
	}
	if r.client.Stats().Sent != sent {
		t.Error("restore without prior state published a command")
	}
}

func TestWaitState(t *testing.T) {
	now := time.Now()
	r := newRig(t, devices.HandlerOptions{MaxRetryAfter: 2 * time.Second, Now: func() time.Time { return now }})
	r.device(t, "bedroom-curtain", map[string]any{"position": 0, "moving": false}, nil)
	req := stepReq(t, "m1.s2", 1, map[string]any{"device": "bedroom-curtain", "state": map[string]any{"position": 100}, "timeout": "10s"})
	req.Started = now.Add(-time.Second)

	_, err := r.run(t, devices.KindWaitState, req)
	wantClass(t, err, driver.NotReady, devices.CodeWaitingState)
	var se *driver.StepError
	if errors.As(err, &se) && se.RetryAfter != 2*time.Second {
		t.Errorf("retry after %v, want the 2s cap", se.RetryAfter)
	}

	late := req
	late.Started = now.Add(-9500 * time.Millisecond)
	_, err = r.run(t, devices.KindWaitState, late)
	if errors.As(err, &se) && se.RetryAfter != 500*time.Millisecond {
		t.Errorf("retry after %v, want the 500ms remaining", se.RetryAfter)
	}
	late.Started = now.Add(-11 * time.Second)
	_, err = r.run(t, devices.KindWaitState, late)
	wantClass(t, err, driver.Permanent, devices.CodeWaitTimeout)

	if _, err := send(t.Context(), r.client, "bedroom-curtain", wire.Command{ID: "open-1", Action: "open"}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, r.client, "bedroom-curtain", "open", func() bool { st, _ := r.client.State("bedroom-curtain"); return st["position"] == int64(100) })
	out, err := r.run(t, devices.KindWaitState, req)
	if err != nil {
		t.Fatalf("after the state matched: %v", err)
	}
	if st := out["state"].(map[string]any); st["position"] != int64(100) {
		t.Errorf("outputs = %v", out)
	}
	bad := stepReq(t, "x", 1, map[string]any{"device": "nowhere", "state": map[string]any{"a": 1}})
	_, err = r.run(t, devices.KindWaitState, bad)
	wantClass(t, err, driver.Permanent, devices.CodeUnknownDevice)
}

// Decoded params are kept for the next step with the same ones, and
// shared: each command still carries them whole, and params that fail to
// decode fail every time.
func TestCommandParamsReused(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	d := r.device(t, "living-ac", map[string]any{"power": "off"}, nil)
	params := map[string]any{"device": "living-ac", "action": "set", "params": map[string]any{"target": 22, "mode": "cool"}}
	for _, key := range []string{"m1-0-0", "m2-0-0", "m3-0-0"} {
		if _, err := r.run(t, devices.KindCommand, stepReq(t, key, 1, params)); err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		cmd := d.next(t)
		if cmd.ID != key || cmd.Action != "set" || len(cmd.Params) != 2 || cmd.Params["mode"] != "cool" || cmd.Params["target"] != json.Number("22") {
			t.Errorf("device got %+v, want %s: set target 22, mode cool", cmd, key)
		}
	}
	bad := map[string]any{"device": "living-ac", "action": "set", "verfy": true}
	for i := range 2 {
		_, err := r.run(t, devices.KindCommand, stepReq(t, "bad", i+1, bad))
		wantClass(t, err, driver.Permanent, devices.CodeBadStep)
	}
}

// TestAbandonedCommandLeavesItsDevicesQueue: a command waiting for its
// device's turn that the driver gives up (its mission was cancelled)
// leaves the queue, so the turn goes to the next command, and it is
// never sent.
func TestAbandonedCommandLeavesItsDevicesQueue(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	r.device(t, "living-light", lightOff, func(wire.Command, int) reply { return reply{Drop: true} })
	h := r.kinds[devices.KindCommand]
	params := map[string]any{"device": "living-light", "action": "turn_on"}
	if _, err := h.Execute(t.Context(), stepReq(t, "mA.s1", 1, params)); err == nil {
		t.Fatal("A: no ack from the light, yet not pending")
	}
	reqB := stepReq(t, "mB.s1", 1, params)
	_, err := h.Execute(t.Context(), reqB)
	var pb *driver.PendingError
	if !errors.As(err, &pb) || pb.InFlight {
		t.Fatalf("B: %v, want pending for its turn", err)
	}
	if s := r.h.Links()[""]; s.Queued != 1 {
		t.Fatalf("links %+v, want B queued", s)
	}
	reqB.Resume = &driver.Parked{Key: pb.Key, Until: pb.Until, Note: pb.Note, Abandon: true}
	if _, err := h.Execute(t.Context(), reqB); err != nil {
		t.Fatalf("abandon: %v", err)
	}
	if s := r.h.Links()[""]; s.Queued != 0 || s.InFlight != 1 {
		t.Fatalf("links %+v after B was abandoned, want only A in flight", s)
	}
	if n := r.client.Stats().Sent; n != 1 {
		t.Fatalf("%d commands sent, want A's alone", n)
	}
}

// TestOlderStepWaitsForANewerCommandInFlightBeforeGivingWay: an older
// mission's command is applied but its ack is lost; before its retry, a
// newer mission of another scene takes the device over, and the device
// refuses the newer command (busy). The older step's retry, made while
// the newer command is in flight, waits for its outcome instead of
// giving way at once: the refusal gives the device back, and the retry
// completes (the device re-acks). Giving way there left the device in
// the older mission's state under a step recorded as superseded, with
// nothing newer on it: the torn end TestOverlapArbitrationNeverTearsOrFlipFlops
// caught once under load.
func TestOlderStepWaitsForANewerCommandInFlightBeforeGivingWay(t *testing.T) {
	r := newRig(t, devices.HandlerOptions{})
	holdB := make(chan struct{})
	dev := r.device(t, "living-light", lightOff, func(cmd wire.Command, n int) reply {
		switch {
		case cmd.ID == "mA-0-0" && n == 1:
			return reply{Drop: true} // applied, its ack lost
		case cmd.ID == "mB-0-0" && n == 1:
			return reply{Hold: holdB, Code: wire.CodeBusy}
		}
		return reply{}
	})
	t0 := time.Now()
	req := func(mission, scene string, created time.Time, attempt, brightness int) driver.StepRequest {
		raw, err := json.Marshal(map[string]any{"device": "living-light", "action": "turn_on",
			"params": map[string]any{"brightness": brightness}, "ack_timeout": "150ms"})
		if err != nil {
			t.Fatal(err)
		}
		return driver.StepRequest{MissionID: mission, MissionType: scene, IdempotencyKey: mission + "-0-0", Attempt: attempt,
			Params: raw, Created: created, Started: t0, Deadline: time.Now().Add(10 * time.Second)}
	}
	h := r.kinds[devices.KindCommand]
	_, err := r.run(t, devices.KindCommand, req("mA", "evening", t0, 1, 30))
	wantClass(t, err, driver.Retryable, devices.CodeAckTimeout)

	// B, newer, takes the light over; its command is held at the device.
	_, err = h.Execute(t.Context(), req("mB", "movie", t0.Add(time.Second), 1, 70))
	var pb *driver.PendingError
	if !errors.As(err, &pb) || !pb.InFlight {
		t.Fatalf("B: %v, want in flight", err)
	}
	_, err = h.Execute(t.Context(), req("mA", "evening", t0, 2, 30))
	wantClass(t, err, driver.NotReady, devices.CodeNewerInFlight)

	close(holdB) // the light refuses B's command: busy
	if !r.wakes.await(devices.AckKey("living-light", "mB-0-0"), time.Now().Add(5*time.Second)) {
		t.Fatal("no answer to B's command")
	}
	bReq := req("mB", "movie", t0.Add(time.Second), 1, 70)
	bReq.Resume = &driver.Parked{Key: pb.Key, Until: pb.Until, Note: pb.Note, Since: t0, Woken: true, InFlight: true}
	_, err = h.Execute(t.Context(), bReq)
	wantClass(t, err, driver.Retryable, wire.CodeBusy)

	out, err := r.run(t, devices.KindCommand, req("mA", "evening", t0, 2, 30))
	if err != nil {
		t.Fatalf("A's retry once B's command was refused: %v, want it done (the light re-acks A's command)", err)
	}
	if st, _ := out["state"].(map[string]any); st["brightness"] != int64(30) {
		t.Errorf("A's outputs %v, want the light at 30", out)
	}
	if n := dev.effectCount("mA-0-0"); n != 1 {
		t.Errorf("A's command applied %d times, want once", n)
	}
}
