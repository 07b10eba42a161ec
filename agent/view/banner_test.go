package view

import (
	"strings"
	"testing"
	"time"
)

// TestBannerTellsHowToDriveTheAgent: the banner names the broker and the
// API, and its mosquitto_pub line works as pasted: this host for a
// wildcard listen address, the port when it is not 1883, and the TLS and
// login flags the broker needs.
func TestBannerTellsHowToDriveTheAgent(t *testing.T) {
	b := Banner{
		Gateway: "home", BrokerURL: "ssl://0.0.0.0:8883", BrokerListen: "0.0.0.0:8883",
		Scenes: []string{"go_home", "good_night"}, TriggerTopic: "sortie/gateways/home/trigger",
		BrokerTLS: true, BrokerLogin: true,
	}
	got := b.String(time.Unix(1700000000, 0))
	for _, want := range []string{
		`Sortie agent "home" ready. Broker ssl://0.0.0.0:8883, API (disabled).`,
		"Scenes: go_home, good_night.",
		`mosquitto_pub -h 127.0.0.1 -p 8883 --cafile CA.pem -u APP_USER -P PASSWORD -q 1 -t sortie/gateways/home/trigger -m '{"scene":"good_night","request_id":"night-1700000000"}'`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("banner lacks %q:\n%s", want, got)
		}
	}
	plain := Banner{BrokerListen: "127.0.0.1:1883", API: "http://127.0.0.1:8080", TriggerTopic: "t", Scenes: []string{"go_home"}}.String(time.Unix(0, 0))
	if !strings.Contains(plain, "mosquitto_pub -h 127.0.0.1 -q 1 -t t ") || !strings.Contains(plain, "API http://127.0.0.1:8080.") {
		t.Errorf("plain banner:\n%s", plain)
	}
}

// TestBannerExamplesWorkAsPasted: the examples trigger scenes the agent
// has (the demo's movie_night and good_night where it has them), and
// the CLI's line names the API's address when it is not the default.
func TestBannerExamplesWorkAsPasted(t *testing.T) {
	for _, tc := range []struct {
		scenes    []string
		api       string
		cli, mqtt string
	}{
		{[]string{"go_home", "good_night", "movie_night"}, "http://127.0.0.1:8080", "./bin/agent trigger movie_night\n", `"scene":"good_night"`},
		{[]string{"go_home", "leave_home"}, "http://127.0.0.1:18080", "./bin/agent trigger go_home -addr 127.0.0.1:18080\n", `"scene":"leave_home"`},
		{[]string{"only"}, "http://127.0.0.1:8080", "./bin/agent trigger only\n", `"scene":"only"`},
	} {
		got := Banner{BrokerListen: "127.0.0.1:1883", API: tc.api, TriggerTopic: "t", Scenes: tc.scenes}.String(time.Unix(0, 0))
		if !strings.Contains(got, tc.cli) || !strings.Contains(got, tc.mqtt) {
			t.Errorf("scenes %v, API %s: want %q and %q in\n%s", tc.scenes, tc.api, tc.cli, tc.mqtt, got)
		}
	}
}
