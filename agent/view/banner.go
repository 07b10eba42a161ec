package view

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// Banner is what someone watching the progress view is told once the
// agent is up: what runs where, and how to drive it.
type Banner struct {
	Gateway      string
	BrokerURL    string   // what devices and apps dial
	BrokerListen string   // the embedded broker's bound host:port ("" for an external one)
	API          string   // the management API's URL ("" when disabled)
	Scenes       []string // the scenes that can be triggered
	TriggerTopic string
	BrokerTLS    bool // the embedded broker speaks TLS
	BrokerLogin  bool // the embedded broker asks for a login
}

// String draws the banner; now numbers the example's request ID.
func (b Banner) String(now time.Time) string {
	host, port := "BROKER", ""
	if b.BrokerListen != "" {
		host, port, _ = net.SplitHostPort(b.BrokerListen)
		if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
			host = "127.0.0.1" // listening everywhere, this host included
		}
	}
	api := b.API
	if api == "" {
		api = "(disabled)"
	}
	var s strings.Builder
	fmt.Fprintf(&s, "Sortie agent %q ready. Broker %s, API %s.\nScenes: %s.\n", b.Gateway, b.BrokerURL, api, strings.Join(b.Scenes, ", "))
	if len(b.Scenes) == 0 {
		s.WriteString("Ctrl-C stops (in-flight steps finish first).\n\n")
		return s.String()
	}
	// The examples trigger scenes this agent has: the demo's movie_night
	// and good_night where it has them (they show the most).
	pick := func(want string, i int) string {
		for _, sc := range b.Scenes {
			if sc == want {
				return sc
			}
		}
		return b.Scenes[min(i, len(b.Scenes)-1)]
	}
	s.WriteString("Trigger one from another terminal:\n")
	if b.API != "" {
		addr := ""
		if b.API != "http://127.0.0.1:8080" { // the CLI's default
			addr = " -addr " + strings.TrimPrefix(b.API, "http://")
		}
		fmt.Fprintf(&s, "  ./bin/agent trigger %s%s\n", pick("movie_night", 0), addr)
	}
	flags := ""
	if port != "" && port != "1883" {
		flags += " -p " + port
	}
	if b.BrokerTLS {
		flags += " --cafile CA.pem"
	}
	if b.BrokerLogin {
		flags += " -u APP_USER -P PASSWORD"
	}
	fmt.Fprintf(&s, "  mosquitto_pub -h %s%s -q 1 -t %s -m '{\"scene\":%q,\"request_id\":\"night-%d\"}'\n", host, flags, b.TriggerTopic, pick("good_night", 1), now.Unix())
	s.WriteString("Ctrl-C stops (in-flight steps finish first).\n\n")
	return s.String()
}
