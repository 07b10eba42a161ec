package hub

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"testing"

	"github.com/sortie-edge/sortie/internal/clustertest"
)

// TestNATSExampleConfig holds configs/nats.conf to what the cluster tests
// run with: nats-server takes the file, and the hub's and the example
// gateway's permissions there are those the tests give them (hubNATSUser
// and gatewayUser), which fail when the hub or a gateway needs more.
func TestNATSExampleConfig(t *testing.T) {
	const path = "../configs/nats.conf"
	bin, err := clustertest.NATSServer()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-t", "-c", path).CombinedOutput(); err != nil {
		t.Fatalf("nats-server -t: %v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	quoted := regexp.MustCompile(`"([^"]*)"`)
	list := func(s string) []string {
		var out []string
		for _, m := range quoted.FindAllStringSubmatch(s, -1) {
			out = append(out, m[1])
		}
		return out
	}
	for _, u := range []struct {
		name               string
		publish, subscribe []string
		connectionTypes    []string
	}{
		{"hub", hubNATSUser().Publish, hubNATSUser().Subscribe, hubNATSUser().ConnectionTypes},
		{"home", gatewayUser("home").Publish, gatewayUser("home").Subscribe, gatewayUser("home").ConnectionTypes},
	} {
		re := regexp.MustCompile(`(?s)\{user: "` + u.name + `",.*?publish: \{allow: \[(.*?)\]\}.*?subscribe: \{allow: \[(.*?)\]\}\},\s*allowed_connection_types: \[(.*?)\]\}`)
		m := re.FindSubmatch(b)
		if m == nil {
			t.Errorf("configs/nats.conf has no user %q with publish, subscribe and connection types", u.name)
			continue
		}
		for i, want := range [][]string{u.publish, u.subscribe, u.connectionTypes} {
			if got := list(string(m[i+1])); !slices.Equal(got, want) {
				t.Errorf("user %q in configs/nats.conf: %v, the tests give it %v", u.name, got, want)
			}
		}
	}
}
