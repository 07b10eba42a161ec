package devices_test

import (
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/simulator"
)

// TestAnnouncementsReportDevicesThatAppearAndLeave: while the agent
// runs, a bulb paired on the Zigbee2MQTT bridge, and a DIY board
// announcing itself to Home Assistant, are reported as devices the
// registry does not name; a device of the registry removed from the
// bridge is reported gone. Nothing is added to the registry.
func TestAnnouncementsReportDevicesThatAppearAndLeave(t *testing.T) {
	b := brokertest.Start(t)
	reg, err := devices.ParseRegistry([]byte(z2mRegistry), "eco.toml")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan devices.Announcement, 64)
	c := dial(t, b, func(o *devices.Options) {
		o.Registry = reg
		o.OnAnnouncement = func(a devices.Announcement) { got <- a }
	})
	next := func(what string) devices.Announcement {
		t.Helper()
		select {
		case a := <-got:
			return a
		case <-time.After(5 * time.Second):
			t.Fatalf("no announcement: want %s", what)
		}
		return devices.Announcement{}
	}
	z, err := simulator.StartZigbee2MQTT(t.Context(), simulator.Z2MConfig{Broker: b.URL(), Devices: []simulator.Z2MDevice{
		{Name: "Hall/Bulb", Kind: "light"}, {Name: "Front door", Kind: "lock"}, {Name: "Blind", Kind: "cover"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(z.Close)
	if err := z.Pair(simulator.Z2MDevice{Name: "Porch/Light", Kind: "light"}); err != nil {
		t.Fatal(err)
	}
	if a := next("the paired bulb"); a.Found.Protocol != "zigbee2mqtt" || a.Found.Address != "Porch/Light" || a.Found.Kind != "light" || a.Device != "" || a.Gone {
		t.Fatalf("got %+v, want the new bulb", a)
	}
	ha, err := simulator.StartHA(t.Context(), simulator.HAConfig{Conn: simulator.Conn{Broker: b.URL()}, Name: "shed",
		Entities: []simulator.HAEntity{{Type: "switch", ObjectID: "fan"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ha.Close)
	if a := next("the DIY board"); a.Found.Protocol != "homeassistant" || a.Found.Address != "switch/shed/fan" || a.Found.Config == nil {
		t.Fatalf("got %+v, want the board's fan", a)
	}
	z.Remove("Hall/Bulb")
	if a := next("the removed bulb"); !a.Gone || a.Device != "hall-bulb" {
		t.Fatalf("got %+v, want hall-bulb gone", a)
	}
	list := c.Announced()
	if len(list) != 3 || list[0].Found.Address != "switch/shed/fan" || list[1].Found.Address != "Porch/Light" || list[2].Device != "hall-bulb" || !list[2].Gone {
		t.Fatalf("Announced: %+v", list)
	}
	if _, ok := reg.Device("hall-bulb"); !ok {
		t.Error("the registry lost a device")
	}
	// The bulb comes back: it is announced again, and no longer listed.
	if err := z.Pair(simulator.Z2MDevice{Name: "Hall/Bulb", Kind: "light"}); err != nil {
		t.Fatal(err)
	}
	if a := next("the bulb back"); a.Gone || a.Device != "hall-bulb" {
		t.Fatalf("got %+v, want hall-bulb back", a)
	}
	if list := c.Announced(); len(list) != 2 {
		t.Fatalf("Announced after the bulb came back: %+v", list)
	}
}
