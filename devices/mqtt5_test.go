package devices_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices/wire"
)

// v5Device is a device that speaks MQTT 5 over a bare TCP connection,
// its packets written and read with mochi's codec: the agent's client
// speaks 3.1.1, and no MQTT 5 client library is among the dependencies.
type v5Device struct {
	t    testing.TB
	conn net.Conn
	r    *bufio.Reader
	id   uint16 // last packet ID used
}

// dialV5 connects as an MQTT 5 client with a clean start, no session
// expiry and the device's "offline" will.
func dialV5(t testing.TB, addr, clientID string, topics wire.Topics, device string) *v5Device {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	d := &v5Device{t: t, conn: conn, r: bufio.NewReader(conn)}
	d.write(&packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Connect}, ProtocolVersion: 5,
		Connect: packets.ConnectParams{
			ProtocolName: []byte("MQTT"), Clean: true, Keepalive: 30, ClientIdentifier: clientID,
			WillFlag: true, WillTopic: topics.Availability(device), WillPayload: []byte(wire.Offline), WillQos: 1, WillRetain: true,
		},
	}, (*packets.Packet).ConnectEncode)
	if pk := d.read(packets.Connack); pk.ReasonCode != 0 {
		t.Fatalf("CONNACK reason 0x%02x", pk.ReasonCode)
	}
	return d
}

func (d *v5Device) write(pk *packets.Packet, encode func(*packets.Packet, *bytes.Buffer) error) {
	d.t.Helper()
	var buf bytes.Buffer
	if err := encode(pk, &buf); err != nil {
		d.t.Fatal(err)
	}
	if err := d.conn.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
		d.t.Fatal(err)
	}
	if _, err := d.conn.Write(buf.Bytes()); err != nil {
		d.t.Fatal(err)
	}
}

// read reads the next packet, which must be of type want.
func (d *v5Device) read(want byte) packets.Packet {
	d.t.Helper()
	if err := d.conn.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		d.t.Fatal(err)
	}
	hb, err := d.r.ReadByte()
	if err != nil {
		d.t.Fatalf("read: %v", err)
	}
	pk := packets.Packet{ProtocolVersion: 5}
	if err := pk.FixedHeader.Decode(hb); err != nil {
		d.t.Fatal(err)
	}
	n, _, err := packets.DecodeLength(d.r)
	if err != nil {
		d.t.Fatal(err)
	}
	pk.FixedHeader.Remaining = n
	body := make([]byte, n)
	if _, err := io.ReadFull(d.r, body); err != nil {
		d.t.Fatal(err)
	}
	if pk.FixedHeader.Type != want {
		d.t.Fatalf("got packet type %d, want %d", pk.FixedHeader.Type, want)
	}
	switch want {
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Suback:
		err = pk.SubackDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	}
	if err != nil {
		d.t.Fatal(err)
	}
	return pk
}

// publish publishes at QoS 1 with the properties given and waits for
// the PUBACK, which must be a success.
func (d *v5Device) publish(topic string, payload []byte, retain bool, props packets.Properties) {
	d.t.Helper()
	d.id++
	d.write(&packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1, Retain: retain}, ProtocolVersion: 5,
		TopicName: topic, Payload: payload, PacketID: d.id, Properties: props,
	}, (*packets.Packet).PublishEncode)
	if pk := d.read(packets.Puback); pk.PacketID != d.id || pk.ReasonCode >= 0x80 {
		d.t.Fatalf("PUBACK %d reason 0x%02x for %s", pk.PacketID, pk.ReasonCode, topic)
	}
}

// TestMQTT5DeviceIsCommandedAndAcked: a device that speaks MQTT 5 to the
// same broker as the agent's 3.1.1 client is a device like any other. It
// follows docs/protocol.md in MQTT 5 terms (clean start, no session
// expiry; subscribe, state, then "online") and sets properties of its
// own on its ack, which the agent neither needs nor sees; its last will
// marks it offline.
func TestMQTT5DeviceIsCommandedAndAcked(t *testing.T) {
	b := brokertest.Start(t)
	topics := wire.Topics{}
	c := dial(t, b, nil)
	d := dialV5(t, b.Addr(), "lamp5", topics, "lamp5")

	d.id++
	d.write(&packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Subscribe, Qos: 1}, ProtocolVersion: 5, PacketID: d.id,
		Filters: packets.Subscriptions{{Filter: topics.Command("lamp5"), Qos: 1}},
	}, (*packets.Packet).SubscribeEncode)
	if pk := d.read(packets.Suback); !bytes.Equal(pk.ReasonCodes, []byte{1}) {
		t.Fatalf("SUBACK reasons %v, want granted QoS 1", pk.ReasonCodes)
	}
	d.publish(topics.State("lamp5"), []byte(`{"state":{"power":"off"}}`), true, packets.Properties{})
	d.publish(topics.Availability("lamp5"), []byte(wire.Online), true, packets.Properties{})
	waitUntil(t, c, "lamp5", "state and availability", func() bool {
		st, ok := c.State("lamp5")
		return ok && st["power"] == "off" && c.Available("lamp5")
	})

	type result struct {
		ack wire.Ack
		err error
	}
	sent := make(chan result, 1)
	go func() {
		ack, err := sendTimeout(t.Context(), c, "lamp5", wire.Command{ID: "v5-1", Action: "turn_on", Params: map[string]any{"brightness": 40}}, 5*time.Second)
		sent <- result{ack, err}
	}()
	pk := d.read(packets.Publish)
	if pk.FixedHeader.Qos != 1 || pk.TopicName != topics.Command("lamp5") {
		t.Fatalf("command on %s at QoS %d", pk.TopicName, pk.FixedHeader.Qos)
	}
	d.write(&packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, ProtocolVersion: 5, PacketID: pk.PacketID},
		(*packets.Packet).PubackEncode)
	cmd, err := wire.DecodeCommand(pk.Payload)
	if err != nil {
		t.Fatalf("command %q: %v", pk.Payload, err)
	}
	if cmd.ID != "v5-1" || cmd.Action != "turn_on" {
		t.Fatalf("command %+v", cmd)
	}
	ack := fmt.Appendf(nil, `{"id":%q,"ok":true,"state":{"power":"on","brightness":40},"prior":{"power":"off"}}`, cmd.ID)
	d.publish(topics.Ack("lamp5"), ack, false, packets.Properties{
		ContentType: "application/json", PayloadFormat: 1, PayloadFormatFlag: true,
		CorrelationData: []byte("v5-1"), User: []packets.UserProperty{{Key: "fw", Val: "2.1"}},
	})
	d.publish(topics.State("lamp5"), []byte(`{"state":{"power":"on","brightness":40}}`), true, packets.Properties{})

	r := <-sent
	if r.err != nil || !r.ack.OK || r.ack.State["brightness"] != int64(40) || r.ack.Prior["power"] != "off" {
		t.Fatalf("Send: ack %+v, err %v", r.ack, r.err)
	}
	waitUntil(t, c, "lamp5", "reported state", func() bool { st, _ := c.State("lamp5"); return st["power"] == "on" })
	if s := c.Stats(); s.MalformedAcks != 0 || s.UnknownAcks != 0 || s.Malformed != 0 {
		t.Errorf("stats = %+v, want nothing malformed or unknown", s)
	}

	// A power cut: the connection ends without DISCONNECT, and the
	// broker publishes the will.
	_ = d.conn.Close()
	waitUntil(t, c, "lamp5", "offline from the last will", func() bool { return !c.Available("lamp5") })
	waitGone(t, b, "lamp5")
}

// TestMQTT5DeviceInProcess runs it with the agent's client on the broker
// in process, as with the embedded broker.
func TestMQTT5DeviceInProcess(t *testing.T) {
	inProcess = true
	defer func() { inProcess = false }()
	TestMQTT5DeviceIsCommandedAndAcked(t)
}
