package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/eclipse/paho.mqtt.golang/packets"
	"github.com/nats-io/nats.go"

	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/uplink"
)

// TestNATSUserLogsIn: the entries nats-user prints go into a real
// nats-server's users as they are; the gateway then logs in over MQTT
// with its password (a wrong one is refused as not authorised), and
// what it publishes on its own topics reaches the hub's user, logged in
// over NATS, while what it publishes on another gateway's does not; a
// gateway named "*" is refused.
func TestNATSUserLogsIn(t *testing.T) {
	entry := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"nats-user"}, args...), strings.NewReader("pw-"+args[len(args)-1]), &out, &errb); code != 0 {
			t.Fatalf("nats-user %v: exit %d: %s", args, code, errb.String())
		}
		return out.String()
	}
	users := entry("gw.one") + entry("-hub", "hubuser") + entry("-system", "sysuser")
	if !strings.Contains(users, `{user: "sysuser", password: "$2a$11$`) {
		t.Errorf("the system user's entry: want its name and a bcrypt hash, got\n%s", users)
	}
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
	if c, err := mqttLogin("wrong"); !errors.Is(err, packets.ErrorRefusedNotAuthorised) {
		if c != nil {
			c.Disconnect(0)
		}
		t.Fatalf("a wrong password: %v, want refused as not authorised", err)
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

	// The system user's hash is one nats-server takes.
	sys, err := nats.Connect(node.ClientURL(), nats.UserInfo("sysuser", "pw-sysuser"))
	if err != nil {
		t.Fatalf("the system user's login with its hashed password: %v", err)
	}
	sys.Close()
	nc, err := nats.Connect(node.ClientURL(), nats.UserInfo("hubuser", "pw-hubuser"))
	if err != nil {
		t.Fatalf("the hub's login: %v", err)
	}
	defer nc.Close()
	got := make(chan *nats.Msg, 4)
	if _, err := nc.ChanSubscribe("sortie.hub.gateways.>", got); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// NATS acknowledges a refused MQTT publish too: only delivery tells.
	for _, topic := range []string{uplink.Topics{}.Events("other"), uplink.Topics{}.Events("gw.one")} {
		if tok := c.Publish(topic, 1, false, []byte(topic)); !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
			t.Fatalf("publish on %s: %v", topic, tok.Error())
		}
	}
	select {
	case m := <-got:
		if own := (uplink.Topics{}).Events("gw.one"); string(m.Data) != own {
			t.Fatalf("the hub got %q on %s: the gateway published on another gateway's topic", m.Data, m.Subject)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the gateway's own events never reached the hub")
	}

	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"nats-user", "*"}, strings.NewReader("pw"), &out, &errb); code != 2 || !strings.Contains(errb.String(), "wildcard") {
		t.Errorf("nats-user *: exit %d, stderr %q; want a refusal naming the wildcard", code, errb.String())
	}
}
