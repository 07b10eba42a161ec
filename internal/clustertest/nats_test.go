package clustertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	paho "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sortie-edge/sortie/internal/clustertest"
	"github.com/sortie-edge/sortie/internal/testkit"
)

// Three nodes form one cluster: every node sees a JetStream meta group
// of three with one leader, and a message published on n1 reaches a
// subscriber on n3.
func TestNATSClusterForms(t *testing.T) {
	t.Parallel()
	c := clustertest.StartNATS(t, 3, clustertest.NATSOptions{})

	for _, n := range c.Nodes {
		var jsz struct {
			Meta struct {
				Leader      string `json:"leader"`
				ClusterSize int    `json:"cluster_size"`
			} `json:"meta_cluster"`
		}
		getJSON(t, n.MonitorURL()+"/jsz", &jsz)
		if jsz.Meta.ClusterSize != 3 || c.Node(jsz.Meta.Leader) == nil {
			t.Errorf("%s: meta cluster size %d, leader %q; want 3 and one of the nodes",
				n.Name, jsz.Meta.ClusterSize, jsz.Meta.Leader)
		}
		if n.PID() == 0 {
			t.Errorf("%s: PID 0 while running", n.Name)
		}
	}

	ch := subscribe(t, c, c.Nodes[2], "hello", c.Nodes[0])
	pub := natsConnect(t, c, c.Nodes[0])
	if err := pub.Publish("hello", []byte("from n1")); err != nil {
		t.Fatal(err)
	}
	if m := receive(t, ch); string(m.Data) != "from n1" {
		t.Errorf("got %q, want %q", m.Data, "from n1")
	}
}

// A replicated (R3) stream keeps every acknowledged message across a
// SIGKILL of its leader: publishing goes on with the two others, and the
// restarted node catches up and, made leader again, serves all of them.
func TestStreamSurvivesLeaderKill(t *testing.T) {
	t.Parallel()
	c := clustertest.StartNATS(t, 3, clustertest.NATSOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	nc := natsConnect(t, c, nil)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "EVENTS", Subjects: []string{"events.>"}, Replicas: 3, Storage: jetstream.FileStorage,
	})
	if err != nil {
		t.Fatal(err)
	}
	const half = 100
	publish := func(from, to int) {
		t.Helper()
		for i := from; i <= to; i++ {
			publishRetry(ctx, t, js, "events.gw1", strconv.Itoa(i))
		}
	}
	publish(1, half)

	leader := streamLeader(ctx, t, stream)
	victim := c.Node(leader)
	pid := victim.PID()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	publishRetry(ctx, t, js, "events.gw1", strconv.Itoa(half+1))
	t.Logf("killed leader %s (pid %d): the next publish was acknowledged %v later",
		leader, pid, time.Since(killed).Round(time.Millisecond))
	publish(half+2, 2*half)
	if now := streamLeader(ctx, t, stream); now == leader {
		t.Fatalf("leader still %s after its kill", now)
	}

	restarted := time.Now()
	if err := victim.Restart(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s restarted and healthy in %v", victim.Name, time.Since(restarted).Round(time.Millisecond))
	if victim.PID() == pid || victim.PID() == 0 {
		t.Fatalf("PID after Restart = %d (before %d)", victim.PID(), pid)
	}
	// The restarted node is healthy (its replica current); make it the
	// leader, so the messages read below are its copy.
	makeLeader(ctx, t, nc, stream, victim.Name)

	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2*half {
		t.Errorf("stream holds %d messages, want %d", info.State.Msgs, 2*half)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[string]bool)
	for len(seen) < 2*half {
		batch, err := cons.Fetch(2*half, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if seen[string(m.Data())] {
				t.Errorf("message %s twice", m.Data())
			}
			seen[string(m.Data())] = true
		}
		if err := batch.Error(); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	for i := 1; i <= 2*half; i++ {
		if !seen[strconv.Itoa(i)] {
			t.Errorf("message %d lost", i)
		}
	}
}

// MQTT on every node: a QoS 1 PUBLISH on n1's MQTT listener reaches a
// NATS subscriber on n3 (topic a/b is subject a.b), a user's
// permissions hold for MQTT as for NATS, and a QoS 1 subscription is a
// JetStream consumer.
func TestMQTTAcrossTheCluster(t *testing.T) {
	t.Parallel()
	gw := clustertest.User{
		Name: "gw1", Password: "gw1-secret",
		Publish:         []string{"sortie.gw1.>"},
		Subscribe:       []string{"sortie.gw1.>"},
		ConnectionTypes: []string{"MQTT"},
	}
	c := clustertest.StartNATS(t, 3, clustertest.NATSOptions{Users: []clustertest.User{gw}})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	mqttStreams(ctx, t, c)

	t.Run("QoS1PublishReachesNATSOnAnotherNode", func(t *testing.T) {
		ch := subscribe(t, c, n3, "a.b", n1)
		mc := mqttConnect(t, n1, "pub-a", c.User, c.Password, true)
		mqttPublish(t, mc, "a/b", 1, "over MQTT")
		if m := receive(t, ch); string(m.Data) != "over MQTT" {
			t.Errorf("got %q on %s, want %q", m.Data, m.Subject, "over MQTT")
		}
	})

	t.Run("PermissionsHoldForMQTT", func(t *testing.T) {
		ch := subscribe(t, c, n3, "sortie.>", n1)
		mc := mqttConnect(t, n1, "gw1", gw.Name, gw.Password, true)
		// Denied, yet acknowledged: a PUBACK is no proof of delivery.
		mqttPublish(t, mc, "sortie/gw2/events", 1, "not mine")
		mqttPublish(t, mc, "sortie/gw1/events", 1, "mine")
		if m := receive(t, ch); m.Subject != "sortie.gw1.events" || string(m.Data) != "mine" {
			t.Errorf("got %q on %s, want only gw1's own message", m.Data, m.Subject)
		}
		if _, err := nats.Connect(n1.ClientURL(), nats.UserInfo(gw.Name, gw.Password)); err == nil {
			t.Error("an MQTT-only user connected over NATS")
		}
	})

	t.Run("OnlyQoS1SubscriptionsAreConsumers", func(t *testing.T) {
		before := mqttConsumers(t, c)
		mc := mqttConnect(t, n2, "gw1", gw.Name, gw.Password, true)
		got := make(chan paho.Message, 2)
		mqttSubscribe(t, mc, "sortie/gw1/ack", 0, got)
		if n := mqttConsumers(t, c); n != before {
			t.Errorf("$MQTT_msgs consumers = %d after a QoS 0 subscription, want %d", n, before)
		}
		mqttSubscribe(t, mc, "sortie/gw1/control", 1, got)
		if n := mqttConsumers(t, c); n != before+1 {
			t.Errorf("$MQTT_msgs consumers = %d after a QoS 1 subscription, want %d", n, before+1)
		}
		waitInterest(t, n3, "sortie.gw1.control")

		// From NATS, a message has no QoS: it arrives at QoS 0.
		nc := natsConnect(t, c, n3)
		if err := nc.Publish("sortie.gw1.control", []byte("from NATS")); err != nil {
			t.Fatal(err)
		}
		// From MQTT at QoS 1, it goes through the consumer at QoS 1.
		hub := mqttConnect(t, n3, "hub", c.User, c.Password, true)
		mqttPublish(t, hub, "sortie/gw1/control", 1, "from MQTT")
		want := map[string]byte{"from NATS": 0, "from MQTT": 1}
		for range want {
			m := testkit.Receive(t, got, 10*time.Second, "the MQTT subscriber on n2 got too little")
			if q, ok := want[string(m.Payload())]; !ok || m.Qos() != q {
				t.Errorf("got %q at QoS %d; want %v", m.Payload(), m.Qos(), want)
			}
		}
		mc.Disconnect(100)
		waitConsumers(t, c, before) // a clean session's consumers go with it
	})

	t.Run("PersistentSessionKeepsItsConsumer", func(t *testing.T) {
		before := mqttConsumers(t, c)
		mc := mqttConnect(t, n1, "gw1-persistent", gw.Name, gw.Password, false)
		mqttSubscribe(t, mc, "sortie/gw1/state", 1, make(chan paho.Message, 1))
		mc.Disconnect(100)
		time.Sleep(200 * time.Millisecond) // time for a deletion that must not come
		waitConsumers(t, c, before+1)
		// The same client ID with a clean session, on another node, drops it.
		again := mqttConnect(t, n3, "gw1-persistent", gw.Name, gw.Password, true)
		again.Disconnect(100)
		waitConsumers(t, c, before)
	})

	t.Run("RetainedReachesALaterSubscriberOnAnotherNode", func(t *testing.T) {
		hub := mqttConnect(t, n1, "hub-retain", c.User, c.Password, true)
		tok := hub.Publish("sortie/gw1/presence", 1, true, "online")
		if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
			t.Fatalf("publish retained: %v", tok.Error())
		}
		// Retained messages spread to the other nodes asynchronously:
		// a subscriber on n3 right after the PUBACK may see none yet.
		for try := 1; ; try++ {
			mc := mqttConnect(t, n3, "gw1-retain", gw.Name, gw.Password, true)
			got := make(chan paho.Message, 1)
			mqttSubscribe(t, mc, "sortie/gw1/presence", 0, got)
			select {
			case m := <-got:
				if string(m.Payload()) != "online" || !m.Retained() {
					t.Errorf("got %q retained=%v, want the retained \"online\"", m.Payload(), m.Retained())
				}
				t.Logf("retained message on n3 at subscription %d", try)
				mc.Disconnect(100)
				return
			case <-time.After(time.Second):
				mc.Disconnect(100)
				if try == 5 {
					t.Fatal("no retained message on n3")
				}
			}
		}
	})
}

// An MQTT QoS 1 PUBLISH is acknowledged once stored in the $MQTT_msgs
// stream (R3). When that stream's leader dies, PUBACKs wait for the
// election, and past the mqtt block's js_api_timeout (5 s) the node
// closes the publisher's connection: a publisher that reconnects and
// publishes again gets every message through.
func TestMQTTPublisherOutlivesDeliveryStreamLeaderKill(t *testing.T) {
	t.Parallel()
	c := clustertest.StartNATS(t, 3, clustertest.NATSOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	js := mqttStreams(ctx, t, c)
	msgs, err := js.Stream(ctx, "$MQTT_msgs")
	if err != nil {
		t.Fatal(err)
	}
	victim := c.Node(streamLeader(ctx, t, msgs))
	var other *clustertest.Node // publisher and subscriber both here
	for _, n := range c.Nodes {
		if n != victim {
			other = n
		}
	}
	got := subscribe(t, c, other, "gw.events", other)

	const total = 60
	refused := 0
	// CONNECT loads the session from $MQTT_sess: it fails too until
	// the MQTT streams have their leaders again.
	connect := func() paho.Client {
		for {
			o := paho.NewClientOptions().AddBroker(other.MQTTURL()).SetClientID("gw").
				SetUsername(c.User).SetPassword(c.Password).SetAutoReconnect(false).
				SetConnectTimeout(5 * time.Second)
			mc := paho.NewClient(o)
			tok := mc.Connect()
			if tok.WaitTimeout(10*time.Second) && tok.Error() == nil {
				return mc
			}
			if ctx.Err() != nil {
				t.Fatalf("connect: %v", tok.Error())
			}
			refused++
			time.Sleep(100 * time.Millisecond)
		}
	}
	mc := connect()
	defer func() { mc.Disconnect(100) }()
	var worst time.Duration
	reconnects := 0
	for i := 1; i <= total; i++ {
		if i == total/3 {
			if err := victim.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		for {
			start := time.Now()
			tok := mc.Publish("gw/events", 1, false, strconv.Itoa(i))
			ok := tok.WaitTimeout(15 * time.Second)
			worst = max(worst, time.Since(start))
			if ok && tok.Error() == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("publish %d: %v", i, tok.Error())
			}
			reconnects++
			mc.Disconnect(0)
			mc = connect()
		}
	}
	t.Logf("killed %s, the $MQTT_msgs leader: slowest PUBACK %v, reconnects %d, failed CONNECTs %d",
		victim.Name, worst.Round(time.Millisecond), reconnects, refused)

	seen := make(map[string]bool)
	for len(seen) < total {
		select {
		case m := <-got:
			seen[string(m.Data)] = true
		case <-time.After(5 * time.Second):
			for i := 1; i <= total; i++ {
				if !seen[strconv.Itoa(i)] {
					t.Errorf("message %d never reached the subscriber", i)
				}
			}
			return
		}
	}
}

// natsConnect connects the admin to node n (nil: any node), reconnecting
// to the others.
func natsConnect(t *testing.T, c *clustertest.NATS, n *clustertest.Node) *nats.Conn {
	t.Helper()
	url := c.ClientURLs()
	if n != nil {
		url = n.ClientURL()
	}
	nc, err := nats.Connect(url, nats.UserInfo(c.User, c.Password),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// subscribe subscribes the admin to subj on node on, and waits until
// node heardBy knows of it. The channel holds 1024 messages; past that
// the connection drops them as a slow consumer's.
func subscribe(t *testing.T, c *clustertest.NATS, on *clustertest.Node, subj string, heardBy *clustertest.Node) <-chan *nats.Msg {
	t.Helper()
	nc := natsConnect(t, c, on)
	ch := make(chan *nats.Msg, 1024)
	if _, err := nc.ChanSubscribe(subj, ch); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if heardBy != on {
		waitInterest(t, heardBy, subj)
	}
	return ch
}

// receive returns the next message on ch, failing after 5 s.
func receive(t *testing.T, ch <-chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no message within 5 s")
		return nil
	}
}

// publishRetry publishes data with its own message ID until the stream
// acknowledges it: across a leader election a publish may time out or
// find no responders, and the retry must not store it twice.
func publishRetry(ctx context.Context, t *testing.T, js jetstream.JetStream, subj, data string) {
	t.Helper()
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.Publish(pctx, subj, []byte(data), jetstream.WithMsgID(data))
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("publish %s: %v", data, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// streamLeader waits for the stream to have a leader and returns its
// server name. Each request has its own short timeout: a request made
// while there is no leader may get no answer at all.
func streamLeader(ctx context.Context, t *testing.T, s jetstream.Stream) string {
	t.Helper()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := s.Info(rctx)
		cancel()
		if err == nil && info.Cluster != nil && info.Cluster.Leader != "" {
			return info.Cluster.Leader
		}
		if ctx.Err() != nil {
			t.Fatalf("no stream leader: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mqttStreams has the cluster create the account's MQTT streams (R3),
// which its first MQTT CONNECT does, and waits until an MQTT QoS 1
// PUBLISH on any node can be stored: each stream has a leader and current
// replicas, and every other node has heard over its routes of the
// delivery stream's interest in its subjects. Until then the node's
// store of the message fails (no responders, or a stream still forming),
// and a failed QoS 1 store closes the publisher's connection: "publish
// warm/up: connection lost before Publish completed", a QoS 1 warm-up
// publish to a node a moment after the streams were created. It returns
// the JetStream client it asked with.
func mqttStreams(ctx context.Context, t *testing.T, c *clustertest.NATS) jetstream.JetStream {
	t.Helper()
	start := time.Now()
	warm := mqttConnect(t, c.Nodes[0], "warm", c.User, c.Password, true)
	warm.Disconnect(100)
	js, err := jetstream.New(natsConnect(t, c, nil))
	if err != nil {
		t.Fatal(err)
	}
	settleStreams(ctx, t, js, "$MQTT_")
	msgs, err := js.Stream(ctx, "$MQTT_msgs")
	if err != nil {
		t.Fatal(err)
	}
	leader := streamLeader(ctx, t, msgs)
	for _, n := range c.Nodes {
		if n.Name != leader {
			waitInterest(t, n, "$MQTT.msgs.>")
		}
	}
	t.Logf("MQTT streams ready for QoS 1 on every node %v after the first CONNECT", time.Since(start).Round(time.Millisecond))
	return js
}

// settleStreams waits until every stream whose name starts with prefix
// (at least one) has a leader and every replica current, as the cluster
// reports it: a stream just created may still be electing or catching up
// its followers, when a write to it can fail.
func settleStreams(ctx context.Context, t *testing.T, js jetstream.JetStream, prefix string) {
	t.Helper()
	start := time.Now()
	var first []string // what was not settled at first, for the log
	for {
		var unsettled []string
		names := js.StreamNames(ctx)
		n := 0
		for name := range names.Name() {
			if !strings.HasPrefix(name, prefix) {
				continue
			}
			n++
			if why := streamUnsettled(ctx, js, name); why != "" {
				unsettled = append(unsettled, name+": "+why)
			}
		}
		if names.Err() == nil && n > 0 && len(unsettled) == 0 {
			if first != nil {
				t.Logf("streams %s* settled after %v; at first: %v", prefix, time.Since(start).Round(time.Millisecond), first)
			}
			return
		}
		if first == nil {
			first = append(unsettled, fmt.Sprintf("%d found", n))
		}
		if ctx.Err() != nil {
			t.Fatalf("streams %s* not settled: %d found, %v, %v", prefix, n, unsettled, names.Err())
		}
		time.Sleep(50 * time.Millisecond) // polling the cluster's view
	}
}

// streamUnsettled says why the stream is not settled; "" when it is.
func streamUnsettled(ctx context.Context, js jetstream.JetStream, name string) string {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(rctx, name)
	if err != nil {
		return err.Error()
	}
	info, err := s.Info(rctx)
	switch {
	case err != nil:
		return err.Error()
	case info.Cluster == nil || info.Cluster.Leader == "":
		return "no leader"
	case len(info.Cluster.Replicas)+1 < info.Config.Replicas:
		return fmt.Sprintf("%d of %d replicas", len(info.Cluster.Replicas)+1, info.Config.Replicas)
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			return "replica " + r.Name + " not current"
		}
	}
	return ""
}

// makeLeader asks the stream's leader to step down in favour of node.
func makeLeader(ctx context.Context, t *testing.T, nc *nats.Conn, s jetstream.Stream, node string) {
	t.Helper()
	req, err := json.Marshal(map[string]any{"placement": map[string]string{"preferred": node}})
	if err != nil {
		t.Fatal(err)
	}
	for streamLeader(ctx, t, s) != node {
		subj := "$JS.API.STREAM.LEADER.STEPDOWN." + s.CachedInfo().Config.Name
		if _, err := nc.RequestWithContext(ctx, subj, req); err != nil && ctx.Err() != nil {
			t.Fatalf("step down for %s: %v", node, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitInterest waits until node n has heard over its routes of a
// subscription to sub made on another node.
func waitInterest(t *testing.T, n *clustertest.Node, sub string) {
	t.Helper()
	testkit.Eventually(t, 5*time.Second, n.Name+"'s remote interest in "+sub, func() bool {
		var routez struct {
			Routes []struct {
				Subs []string `json:"subscriptions_list"`
			} `json:"routes"`
		}
		getJSON(t, n.MonitorURL()+"/routez?subs=1", &routez)
		for _, r := range routez.Routes {
			if slices.Contains(r.Subs, sub) {
				return true
			}
		}
		return false
	})
}

// mqttConsumers is the number of consumers of the MQTT delivery stream.
func mqttConsumers(t *testing.T, c *clustertest.NATS) int {
	t.Helper()
	nc, err := nats.Connect(c.ClientURLs(), nats.UserInfo(c.User, c.Password))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "$MQTT_msgs")
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// waitConsumers waits until the MQTT delivery stream has want consumers.
func waitConsumers(t *testing.T, c *clustertest.NATS, want int) {
	t.Helper()
	testkit.Until(t, 10*time.Second, func() error {
		if n := mqttConsumers(t, c); n != want {
			return fmt.Errorf("$MQTT_msgs consumers = %d, want %d", n, want)
		}
		return nil
	})
}

// mqttConnect connects a paho client to node n, with a clean session
// or a persistent one.
func mqttConnect(t *testing.T, n *clustertest.Node, id, user, password string, clean bool) paho.Client {
	t.Helper()
	o := paho.NewClientOptions().AddBroker(n.MQTTURL()).SetClientID(id).
		SetUsername(user).SetPassword(password).SetCleanSession(clean).
		SetAutoReconnect(false).SetOrderMatters(false).SetConnectTimeout(10 * time.Second)
	mc := paho.NewClient(o)
	tok := mc.Connect()
	if !tok.WaitTimeout(15*time.Second) || tok.Error() != nil {
		t.Fatalf("MQTT connect to %s as %s: %v", n.Name, user, tok.Error())
	}
	t.Cleanup(func() { mc.Disconnect(100) })
	return mc
}

// mqttSubscribe subscribes mc to filter at qos, handing messages to got.
func mqttSubscribe(t *testing.T, mc paho.Client, filter string, qos byte, got chan<- paho.Message) {
	t.Helper()
	tok := mc.Subscribe(filter, qos, func(_ paho.Client, m paho.Message) { got <- m })
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("subscribe %s: %v", filter, tok.Error())
	}
}

func mqttPublish(t *testing.T, mc paho.Client, topic string, qos byte, payload string) {
	t.Helper()
	tok := mc.Publish(topic, qos, false, payload)
	if !tok.WaitTimeout(10*time.Second) || tok.Error() != nil {
		t.Fatalf("publish %s: %v", topic, tok.Error())
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }() // read-only
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(fmt.Errorf("GET %s: %w", url, err))
	}
}
