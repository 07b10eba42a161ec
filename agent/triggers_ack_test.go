package agent

import (
	"context"
	"strings"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/driver"
)

// pubackSpy hears the PUBACKs a broker reads from one client.
type pubackSpy struct {
	mqtt.HookBase
	client string
	got    chan uint16
}

func (s *pubackSpy) ID() string { return "test-puback-spy" }

func (s *pubackSpy) Provides(b byte) bool { return b == mqtt.OnPacketRead }

func (s *pubackSpy) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if cl.ID == s.client && pk.FixedHeader.Type == packets.Puback {
		s.got <- pk.PacketID
	}
	return pk, nil
}

// TestTriggerFromAnExternalBrokerIsAcknowledgedOnceDecided: the agent's
// link to an external broker acknowledges a trigger (its PUBACK) only
// once the trigger is decided, its mission written, so that an agent
// killed before leaves it in its session, to be delivered again at the
// next start. Acknowledged as it was queued, a trigger still queued at a
// SIGKILL was lost: the broker had nothing left to deliver.
func TestTriggerFromAnExternalBrokerIsAcknowledgedOnceDecided(t *testing.T) {
	b := brokertest.Start(t)
	const clientID = "sortie-gw-agent"
	spy := &pubackSpy{client: clientID, got: make(chan uint16, 8)}
	if err := b.Server().AddHook(spy, nil); err != nil {
		t.Fatal(err)
	}
	f := newModesFixture(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	f.fake.beforeSubmit = func(driver.Spec) {
		entered <- struct{}{}
		<-release
	}
	link, err := newLink(b.URL(), clientID, "", "", nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(link.Close) // last: it waits for the handlers, which wait for Run's decisions
	if _, err := link.Subscribe(f.trig.topics.Trigger(), f.trig.onMessageDecided); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := link.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	f.run(t)
	released := false
	t.Cleanup(func() { // first: Run's stop waits for the submit held
		if !released {
			close(release)
		}
	})

	if err := b.Publish(f.trig.topics.Trigger(), []byte(`{"scene":"line","request_id":"r1","source":"test"}`), false, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(waitLimit):
		t.Fatal("the trigger never reached Submit")
	}
	// The link's packets reach the broker in the order it sends them: a
	// PUBACK sent as the trigger was queued is read before this publish
	// is acknowledged.
	if err := link.Publish("sortie/probe", []byte("x"), false, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-spy.got:
		t.Fatalf("the trigger was acknowledged (packet %d) while its mission was being written", id)
	default:
	}

	close(release)
	released = true
	select {
	case <-spy.got:
	case <-time.After(waitLimit):
		t.Fatal("the trigger was not acknowledged once its mission was written")
	}
	select {
	case r := <-f.pub:
		if !strings.Contains(r, `"status":"accepted"`) {
			t.Errorf("reply %s, want accepted", r)
		}
	case <-time.After(waitLimit):
		t.Fatal("no reply")
	}
}
