package hub

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/agent/hubsync"
	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/store"
)

// waitGateway polls the shared store until gateway gw's record
// satisfies ok (the record moves through streams and other replicas:
// nothing here signals it), failing with what after within.
func (c *cluster) waitGateway(t *testing.T, gw, what string, within time.Duration, ok func(Gateway) bool) Gateway {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		g, err := c.replicas[0].st.Gateway(t.Context(), gw)
		if err == nil && ok(g) {
			return g
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not %s within %v: %+v (%v)", gw, what, within, g, err)
		}
		time.Sleep(50 * time.Millisecond) // polling a record other processes write
	}
}

// TestClusterNodeKilledUnderLoad: a NATS node is SIGKILLed while six
// gateways write missions and trigger records. It publishes no will for
// its gateways, yet the hub shows them offline once their heartbeats
// stop for OfflineAfter, and refuses controls to them as
// gateway_offline rather than let them time out; they reconnect through
// the next address of their list (held shut until the test has seen
// all that, so that it is seen rather than raced), come back online and
// take controls again. Through it all every gateway's trigger records
// reach the hub: a sample of them per gateway is answered by "why" on
// both replicas, and every outbox and trace log empties.
func TestClusterNodeKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three NATS nodes and PostgreSQL under load")
	}
	const offlineAfter = 2 * time.Second
	gws := []string{"gw-a", "gw-b", "gw-c", "gw-d", "gw-e", "gw-f"}
	c := startClusterWith(t, 3, 2, gws, func(o *ServiceOptions) { o.OfflineAfter = offlineAfter })
	victim := c.nats.Nodes[0]
	// The victims' way to another node, shut at first.
	way := clustertest.StartProxy(t, c.nats.Nodes[1].MQTTURL())
	way.SetDown(true)
	var victims []*simGateway
	sims := make([]*simGateway, len(gws))
	for i, gw := range gws {
		next := c.nats.Nodes[(i+1)%3].MQTTURL()
		if i%3 == 0 {
			next = way.URL()
		}
		sims[i] = startSimGatewayWith(t, gw, c.nats.Nodes[i%3].MQTTURL(), "", func(o *hubsync.Options) {
			o.Brokers = []string{next}
			o.HeartbeatInterval = offlineAfter / 5
		})
		if i%3 == 0 {
			victims = append(victims, sims[i])
		}
	}
	for _, gw := range gws {
		c.waitGateway(t, gw, "online", 30*time.Second, func(g Gateway) bool { return g.State == StateOnline })
	}

	// Load: each gateway moves a mission on every 40 ms and records a
	// trigger every fourth step, as an agent's trigger service would.
	ctx, stopLoad := context.WithCancel(context.Background())
	defer stopLoad()
	var wg sync.WaitGroup
	requests := make([][]string, len(sims))
	for i, g := range sims {
		wg.Go(func() {
			tick := time.NewTicker(40 * time.Millisecond)
			defer tick.Stop()
			for n := 0; ; n++ {
				g.step(t, fmt.Sprintf("%s-m%d", g.id, n/4))
				if n%4 == 0 {
					rid := fmt.Sprintf("%s-r%d", g.id, n/4)
					ev := store.Evaluation{RequestID: rid, At: time.Now(), Via: "mqtt", Scene: "go_home", Outcome: "accepted", MissionID: fmt.Sprintf("%s-m%d", g.id, n/4)}
					if err := g.db.AddTraces(context.Background(), []store.Evaluation{ev}, nil); err != nil {
						t.Errorf("%s: %v", g.id, err)
						return
					}
					requests[i] = append(requests[i], rid)
					g.mu.Lock()
					if g.up != nil {
						g.up.Notify()
					}
					g.mu.Unlock()
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	for range 25 { // a second of load before the fault
		<-time.After(40 * time.Millisecond)
	}

	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for _, g := range victims {
		rec := c.waitGateway(t, g.id, "offline", 30*time.Second, func(g Gateway) bool { return g.State == StateOffline })
		silent := rec.Since.Sub(rec.LastSeen)
		t.Logf("%s shown offline %v after it was last heard (%v after the kill)", g.id, silent.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
		// The window, a look's period, and a replica's own reconnection
		// (its silence is not the gateway's) at most, with room for a
		// loaded machine.
		if most := 3*offlineAfter + 4*time.Second; rec.Why != OfflineSilent || silent < offlineAfter || silent > most {
			t.Errorf("%s: why %q after %v of silence; want %q after %v to %v", g.id, rec.Why, silent, OfflineSilent, offlineAfter, most)
		}
		for i, r := range c.replicas {
			status, body := r.call("POST", "/api/gateways/"+g.id+"/control", `{"action":"cancel","mission_id":"`+g.id+`-m0"}`)
			if status != http.StatusServiceUnavailable || !strings.Contains(body, `"gateway_offline"`) {
				t.Errorf("control to offline %s through replica %d: %d %s, want 503 gateway_offline", g.id, i, status, body)
			}
		}
	}

	way.SetDown(false)
	for _, g := range victims {
		c.waitGateway(t, g.id, "back online through its next address", 60*time.Second, func(rec Gateway) bool {
			return rec.State == StateOnline && rec.Broker == way.URL()
		})
		// The hub may hear the status before the gateway its PUBACK.
		var st hubsync.Stats
		for until := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) { // polled: another goroutine's state
			g.mu.Lock()
			st = g.up.Stats()
			g.mu.Unlock()
			if st.Connected || time.Now().After(until) {
				break
			}
		}
		if st.Broker != way.URL() {
			t.Errorf("%s is on %q, want the next address of its list, %q", g.id, st.Broker, way.URL())
		}
		for i, r := range c.replicas {
			// The cluster may still be electing the leaders the dead
			// node had: a node then closes connections whose PUBACK
			// waits past js_api_timeout, and the gateway is offline
			// (its will) until it is back. Refused meanwhile, never
			// timed out.
			for until := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) { // a retry's pause, as a client's
				status, body := r.call("POST", "/api/gateways/"+g.id+"/control", `{"action":"cancel","mission_id":"`+g.id+`-m0"}`)
				if status == http.StatusOK && strings.Contains(body, `"ok":true`) {
					break
				}
				if status != http.StatusServiceUnavailable || !strings.Contains(body, `"gateway_offline"`) || time.Now().After(until) {
					t.Errorf("control to %s back online through replica %d: %d %s", g.id, i, status, body)
					break
				}
			}
		}
	}
	stopLoad()
	wg.Wait()

	deadline := time.Now().Add(90 * time.Second)
	for _, g := range sims {
		g.drain(t, deadline, "after the fault")
		for {
			left, err := g.db.TraceLog(context.Background(), 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: trigger records still waiting for the hub's ack, from seq %d", g.id, left[0].Seq)
			}
			time.Sleep(50 * time.Millisecond) // polling a count: nothing signals an empty log to a test
		}
	}
	for i, g := range sims {
		rids := requests[i]
		if len(rids) == 0 {
			t.Fatalf("%s recorded no trigger", g.id)
		}
		// The first, the last and every seventh between.
		sample := []string{rids[0], rids[len(rids)-1]}
		for k := 7; k < len(rids)-1; k += 7 {
			sample = append(sample, rids[k])
		}
		for _, rid := range sample {
			for j, r := range c.replicas {
				if status, body := r.call("GET", "/api/gateways/"+g.id+"/why/"+rid, ""); status != http.StatusOK || !strings.Contains(body, `"outcome":"accepted"`) {
					t.Errorf("why %s/%s through replica %d: %d %s", g.id, rid, j, status, body)
				}
			}
		}
	}
}
