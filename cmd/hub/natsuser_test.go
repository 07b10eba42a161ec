package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"

	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// TestNATSUserLogsIn: the entries nats-user prints go into a real
// nats-server's users as they are; the gateway then logs in over MQTT
// with its password and publishes its events, the hub's user logs in
// over NATS, and a wrong password is refused.
func TestNATSUserLogsIn(t *testing.T) {
	entry := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"nats-user"}, args...), strings.NewReader("pw-"+args[len(args)-1]), &out, &errb); code != 0 {
			t.Fatalf("nats-user %v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	users := entry("gw.one") + entry("-hub", "hubuser")
	n := clustertest.StartNATS(t, 1, clustertest.NATSOptions{Accounts: "  FLEET {\n    jetstream: enabled\n    users: [\n" + users + "    ]\n  }"})
	node := n.Nodes[0]

	mqttLogin := func(password string) (paho.Client, error) {
		opts := paho.NewClientOptions().AddBroker(node.MQTTURL()).SetClientID("sortie-gw-one").
			SetUsername("gw.one").SetPassword(password).SetProtocolVersion(4).SetConnectTimeout(10 * time.Second)
		c := paho.NewClient(opts)
		tok := c.Connect()
		if !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
			return nil, tok.Error()
		}
		return c, nil
	}
	if c, err := mqttLogin("wrong"); err == nil {
		c.Disconnect(0)
		t.Fatal("a wrong password logged in")
	}
	// The account's first MQTT client makes the node set up its MQTT
	// streams, which a loaded machine can take past the node's timeout:
	// that client is refused, and a gateway retries (docs/cluster.md).
	c, err := mqttLogin("pw-gw.one")
	for deadline := time.Now().Add(30 * time.Second); err != nil && time.Now().Before(deadline); {
		time.Sleep(200 * time.Millisecond) // a retry's pause, as a gateway's
		c, err = mqttLogin("pw-gw.one")
	}
	if err != nil {
		t.Fatalf("the gateway's login: %v", err)
	}
	defer c.Disconnect(0)
	if tok := c.Publish(uplink.Topics{}.Events("gw.one"), 1, false, []byte(`{}`)); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		t.Fatalf("the gateway's publish of its events: %v", tok.Error())
	}

	nc, err := nats.Connect(node.ClientURL(), nats.UserInfo("hubuser", "pw-hubuser"))
	if err != nil {
		t.Fatalf("the hub's login: %v", err)
	}
	nc.Close()
}
