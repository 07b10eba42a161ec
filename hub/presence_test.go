package hub

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/uplink"
)

// TestSilentGatewayIsShownOffline: a gateway whose connection stays up
// but which says nothing for OfflineAfter (its broker node died, and no
// will came) is shown offline, saying why and since when, and a control
// to it is refused at once as gateway_offline; a gateway heard from
// meanwhile stays online, and the silent one's next heartbeat brings it
// back.
func TestSilentGatewayIsShownOffline(t *testing.T) {
	// Long enough that a loaded machine's scheduling does not silence
	// the gateway that beats every quarter of it.
	const offlineAfter = 1500 * time.Millisecond
	e := newEnvWith(t, func(o *ServiceOptions) { o.OfflineAfter = offlineAfter }, "quiet", "chatty")
	quiet, chatty := newGateway(t, e.broker.URL(), "quiet"), newGateway(t, e.broker.URL(), "chatty")
	quiet.online(t)
	chatty.online(t)
	e.waitOnline(t, "quiet")
	e.waitOnline(t, "chatty")
	updates, stop := e.svc.Watch(1024)
	defer stop()
	beat := time.NewTicker(offlineAfter / 4)
	defer beat.Stop()
	start := time.Now()
	var g Gateway
wait:
	for deadline := time.After(wait); ; {
		select {
		case u := <-updates:
			switch {
			case u.Gateway == nil || u.Gateway.State != StateOffline:
			case u.Gateway.ID == "chatty":
				t.Fatalf("a gateway heard from every %v was marked offline: %+v", offlineAfter/4, *u.Gateway)
			default:
				g = *u.Gateway
				break wait
			}
		case <-beat.C:
			chatty.publish(t, chatty.topics.Heartbeat("chatty"), false, uplink.Heartbeat{Gateway: "chatty", Time: time.Now()})
		case <-deadline:
			t.Fatal("the silent gateway was never shown offline")
		}
	}
	if took := time.Since(start); took < offlineAfter/2 {
		t.Errorf("shown offline after %v of silence, want about %v", took, offlineAfter)
	}
	if g.Why != OfflineSilent || g.Since.Before(g.LastSeen.Add(offlineAfter)) {
		t.Errorf("record %+v: want why %q, since at least %v after last_seen", g, OfflineSilent, offlineAfter)
	}
	status, body, err := e.request("POST", "/api/gateways/quiet/control", `{"action":"cancel","mission_id":"m1"}`)
	if err != nil || status != http.StatusServiceUnavailable || !strings.Contains(string(body), `"gateway_offline"`) || !strings.Contains(string(body), OfflineSilent) {
		t.Errorf("control to the silent gateway: %d %s (%v), want 503 gateway_offline saying why", status, body, err)
	}
	quiet.publish(t, quiet.topics.Heartbeat("quiet"), false, uplink.Heartbeat{Gateway: "quiet", Time: time.Now()})
	e.waitOnline(t, "quiet")
	if g, err = e.st.Gateway(t.Context(), "quiet"); err != nil || g.Why != "" {
		t.Errorf("back online: %+v (%v), want no why", g, err)
	}
}

// TestOfflineSaysWhy: an offline status with no time is the agent's
// last will (the broker saw the connection end), one with a time its
// goodbye.
func TestOfflineSaysWhy(t *testing.T) {
	st := testStore(t)
	now := time.Now()
	for i, c := range []struct {
		status uplink.Status
		want   string
	}{
		{uplink.Status{State: StateOnline, Time: now}, ""},
		{uplink.Status{State: StateOffline}, OfflineWill},
		{uplink.Status{State: StateOnline, Time: now}, ""},
		{uplink.Status{State: StateOffline, Time: now}, OfflineGoodbye},
	} {
		at := now.Add(time.Duration(i) * time.Second)
		if _, err := st.Apply(t.Context(), []Inbound{{Gateway: "gw", Status: &c.status, Received: at}}); err != nil {
			t.Fatal(err)
		}
		g, err := st.Gateway(t.Context(), "gw")
		if err != nil || g.Why != c.want || g.State != c.status.State {
			t.Errorf("after %+v: %s, why %q (%v); want %s, %q", c.status, g.State, g.Why, err, c.status.State, c.want)
		}
	}
}
