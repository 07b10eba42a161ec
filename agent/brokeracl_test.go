package agent

import (
	"log/slog"
	"testing"

	"github.com/sortie-edge/sortie/broker/passwd"
)

func testHash(t *testing.T, pw string) string {
	t.Helper()
	h, err := passwd.HashCost(pw, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestBrokerAuthRoles(t *testing.T) {
	b := BrokerOptions{Prefix: "sortie", Users: []BrokerUser{
		{Name: "voice", Role: RoleApp, PasswordHash: testHash(t, "voice-password")},
		{Name: "living-light", Role: RoleDevice, PasswordHash: testHash(t, "light-password")},
		{Name: "ops", Role: RoleAdmin, PasswordHash: testHash(t, "ops-password")},
	}}
	a, internal, err := newBrokerAuth(b, "home", "sortie", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, topic string
		write, want bool
	}{
		{"voice", "sortie/gateways/home/trigger", true, true},
		{"voice", "sortie/gateways/other/trigger", true, false},
		{"voice", "sortie/gateways/home/replies/r1", true, false},
		{"voice", "sortie/devices/living-light/cmd", true, false},
		{"voice", "sortie/gateways/home/replies/#", false, true},
		{"voice", "sortie/gateways/home/replies/r1", false, true},
		{"voice", "sortie/gateways/home/missions/+/events", false, true},
		{"voice", "sortie/gateways/home/#", false, false},
		{"voice", "sortie/gateways/home/trigger", false, false},
		{"voice", "sortie/devices/+/state", false, true},
		{"voice", "sortie/devices/front-door/availability", false, true},
		{"voice", "sortie/devices/+/cmd", false, false},
		{"voice", "sortie/devices/#", false, false},
		{"voice", "#", false, false},
		{"living-light", "sortie/devices/living-light/ack", true, true},
		{"living-light", "sortie/devices/living-light/state", true, true},
		{"living-light", "sortie/devices/living-light/availability", true, true},
		{"living-light", "sortie/devices/kitchen-light/state", true, false},
		{"living-light", "sortie/devices/living-light/cmd", true, false},
		{"living-light", "sortie/gateways/home/trigger", true, false},
		{"living-light", "sortie/devices/living-light/cmd", false, true},
		{"living-light", "sortie/devices/+/cmd", false, false},
		{"living-light", "sortie/devices/kitchen-light/cmd", false, false},
		{"ops", "sortie/devices/kitchen-light/cmd", true, true},
		{"ops", "#", false, true},
		{InternalUser, "sortie/devices/kitchen-light/state", true, true},
		{"stranger", "sortie/gateways/home/trigger", true, false},
		{"", "sortie/gateways/home/replies/#", false, false},
	} {
		if got := a.may(c.user, c.topic, c.write); got != c.want {
			t.Errorf("%s %s (write %v): %v, want %v", c.user, c.topic, c.write, got, c.want)
		}
	}
	for _, c := range []struct {
		user, topic string
		want        bool
	}{
		{"living-light", "sortie/devices/living-light/availability", true},
		{"living-light", "sortie/devices/living-light/ack", false},
		{"living-light", "sortie/devices/living-light/state", false},
		{"living-light", "sortie/devices/kitchen-light/availability", false},
		{"voice", "sortie/gateways/home/trigger", true},
		{"voice", "sortie/devices/living-light/availability", false},
		{"ops", "anything/at/all", true},
	} {
		if got := a.mayWill(c.user, c.topic); got != c.want {
			t.Errorf("will of %s on %s: %v, want %v", c.user, c.topic, got, c.want)
		}
	}
	if internal == "" || len(internal) < 16 {
		t.Errorf("internal password %q is too short", internal)
	}
}

// TestEcosystemRolesKeepEachDeviceToItsOwnTopics: a Zigbee2MQTT bridge,
// a Tasmota, a Shelly, an ESPHome node and a device known to Home
// Assistant may publish and subscribe where
// their firmware does, and nowhere else: not another device's topics,
// not the agent's, not a wildcard reaching beyond their own.
func TestEcosystemRolesKeepEachDeviceToItsOwnTopics(t *testing.T) {
	b := BrokerOptions{Prefix: "sortie", Users: []BrokerUser{
		{Name: "z2m", Role: RoleZigbee2MQTT, PasswordHash: testHash(t, "z")},
		{Name: "plug", Role: RoleTasmota, Scope: "tasmota_5E1A2B", PasswordHash: testHash(t, "t")},
		{Name: "pump", Role: RoleShelly, Scope: "shellyplus1-4855199bc0e8", PasswordHash: testHash(t, "s")},
		{Name: "garage", Role: RoleESPHome, Scope: "garage-node", PasswordHash: testHash(t, "e")},
		{Name: "workshop", Role: RoleHomeAssistant, Scope: "workshop", PasswordHash: testHash(t, "h")},
	}}
	a, _, err := newBrokerAuth(b, "home", "sortie-home", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		user, topic string
		write, want bool
	}{
		{"z2m", "zigbee2mqtt/#", false, true},
		{"z2m", "zigbee2mqtt/Hall/Bulb", true, true},
		{"z2m", "zigbee2mqtt/bridge/state", true, true},
		{"z2m", "homeassistant/light/0x00158d/light/config", true, true},
		{"z2m", "homeassistant/status", false, true},
		{"z2m", "homeassistant/status", true, false},
		{"z2m", "homeassistant/button/sortie_home/go_home/config", true, false},
		{"z2m", "#", false, false},
		{"z2m", "sortie/gateways/home/trigger", true, false},
		{"z2m", "cmnd/tasmota_5E1A2B/POWER", true, false},
		{"plug", "cmnd/tasmota_5E1A2B/+", false, true},
		{"plug", "cmnd/tasmotas/+", false, true},
		{"plug", "cmnd/+/POWER", false, false},
		{"plug", "stat/tasmota_5E1A2B/RESULT", true, true},
		{"plug", "tele/tasmota_5E1A2B/LWT", true, true},
		{"plug", "cmnd/tasmota_5E1A2B/POWER", true, true},
		{"plug", "cmnd/tasmota_5E1A2B/Dimmer", true, false},
		{"plug", "tasmota/discovery/A4CF12000001/config", true, true},
		{"plug", "stat/tasmota_OTHER/RESULT", true, false},
		{"pump", "shellyplus1-4855199bc0e8/rpc", false, true},
		{"pump", "shellyplus1-4855199bc0e8/events/rpc", true, true},
		{"pump", "sortie-home/rpc", true, true},
		{"pump", "sortie-home/rpc", false, false},
		{"pump", "other-agent/rpc", true, false},
		{"pump", "shellies/command", false, true},
		{"garage", "garage-node/+/+/command", false, true},
		{"garage", "garage-node/switch/light/state", true, true},
		{"garage", "homeassistant/switch/garage-node/light/config", true, true},
		{"garage", "homeassistant/switch/other-node/light/config", true, false},
		{"garage", "other-node/status", true, false},
		{"workshop", "workshop/+/set", false, true},
		{"workshop", "workshop/fan/state", true, true},
		{"workshop", "workshop/availability", true, true},
		{"workshop", "homeassistant/switch/workshop/fan/config", true, true},
		{"workshop", "homeassistant/light/garage-node/lamp/config", true, false},
		{"workshop", "garage-node/switch/light/command", true, false},
	} {
		if got := a.may(c.user, c.topic, c.write); got != c.want {
			t.Errorf("%s %s (write %v): %v, want %v", c.user, c.topic, c.write, got, c.want)
		}
	}
	for _, bad := range [][]BrokerUser{
		{{Name: "plug", Role: RoleTasmota, PasswordHash: testHash(t, "t")}},
		{{Name: "plug", Role: RoleTasmota, Scope: "a/b", PasswordHash: testHash(t, "t")}},
		{{Name: "pump", Role: RoleShelly, Scope: "x/#", PasswordHash: testHash(t, "s")}},
		{{Name: "voice", Role: RoleApp, Scope: "x", PasswordHash: testHash(t, "v")}},
	} {
		if errs := CheckUsers(bad); len(errs) == 0 {
			t.Errorf("CheckUsers(%+v) found nothing wrong", bad[0])
		}
	}
}
