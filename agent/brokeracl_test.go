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
	a, internal, err := newBrokerAuth(b, "home", slog.New(slog.DiscardHandler))
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
