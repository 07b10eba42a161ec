package fleetsim_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/internal/mqttc"
	"github.com/sortie-edge/sortie/uplink"
)

// recorder plays the hub's side as a plain MQTT client: it sends
// controls and keeps what gateways say back, per gateway.
type recorder struct {
	t      testing.TB
	c      *mqttc.Client
	topics uplink.Topics

	mu         sync.Mutex
	changed    chan struct{}
	results    map[string][]uplink.ControlResult
	statuses   map[string][]uplink.BundleStatus
	heartbeats map[string][]uplink.Heartbeat
	presence   map[string]uplink.Status
}

func newRecorder(t testing.TB, brokerURL string) *recorder {
	t.Helper()
	r := &recorder{t: t, changed: make(chan struct{}), results: map[string][]uplink.ControlResult{},
		statuses: map[string][]uplink.BundleStatus{}, heartbeats: map[string][]uplink.Heartbeat{}, presence: map[string]uplink.Status{}}
	c, err := mqttc.New(mqttc.Options{Broker: brokerURL, ClientID: "test-hub", Ordered: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	r.c = c
	sub := func(kind string, handle func(gw string, p []byte)) {
		if _, err := c.SubscribeQoS(r.topics.Wildcard(kind), 1, func(topic string, p []byte) {
			handle(gatewayOf(topic), p)
		}); err != nil {
			t.Fatal(err)
		}
	}
	sub("control/result", func(gw string, p []byte) {
		res, err := uplink.DecodeControlResult(p)
		if err != nil {
			t.Errorf("control result of %s: %v", gw, err)
			return
		}
		r.note(func() { r.results[gw] = append(r.results[gw], res) })
	})
	sub("bundle/status", func(gw string, p []byte) {
		s, err := uplink.DecodeBundleStatus(p)
		if err != nil {
			t.Errorf("bundle status of %s: %v", gw, err)
			return
		}
		r.note(func() { r.statuses[gw] = append(r.statuses[gw], s) })
	})
	sub("heartbeat", func(gw string, p []byte) {
		h, err := uplink.DecodeHeartbeat(p)
		if err != nil {
			t.Errorf("heartbeat of %s: %v", gw, err)
			return
		}
		r.note(func() { r.heartbeats[gw] = append(r.heartbeats[gw], h) })
	})
	sub("status", func(gw string, p []byte) {
		s, err := uplink.DecodeStatus(p)
		if err != nil {
			t.Errorf("status of %s: %v", gw, err)
			return
		}
		r.note(func() { r.presence[gw] = s })
	})
	if err := c.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	return r
}

// gatewayOf is the {gw} of a hub topic.
func gatewayOf(topic string) string {
	const pre = "sortie/hub/gateways/"
	rest := topic[len(pre):]
	for i := range len(rest) {
		if rest[i] == '/' {
			return rest[:i]
		}
	}
	return rest
}

func (r *recorder) note(f func()) {
	r.mu.Lock()
	f()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// waitFor waits, bounded, until cond holds over the records.
func (r *recorder) waitFor(what string, d time.Duration, cond func() bool) {
	r.t.Helper()
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		ch := r.changed
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-ch:
		case <-t.C:
			r.t.Fatalf("no %s within %s", what, d)
		}
	}
}

// control sends a control request to gw.
func (r *recorder) control(gw string, c uplink.Control) {
	r.t.Helper()
	msg, err := json.Marshal(c)
	if err != nil {
		r.t.Fatal(err)
	}
	if err := r.c.Publish(r.topics.Control(gw), msg, false, 1); err != nil {
		r.t.Fatal(err)
	}
}

// result is gw's latest answer to control id.
func (r *recorder) result(gw, id string) (uplink.ControlResult, int, bool) {
	n, found := 0, uplink.ControlResult{}
	for _, res := range r.results[gw] {
		if res.ID == id {
			n++
			found = res
		}
	}
	return found, n, n > 0
}

func (r *recorder) lastHeartbeat(gw string) (uplink.Heartbeat, bool) {
	hs := r.heartbeats[gw]
	if len(hs) == 0 {
		return uplink.Heartbeat{}, false
	}
	return hs[len(hs)-1], true
}
