package broker

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
)

// rawClient speaks MQTT 3.1.1 over TCP packet by packet, choosing its
// own packet identifiers, as paho does not let a test do.
type rawClient struct {
	t       *testing.T
	nc      net.Conn
	r       *bufio.Reader
	version byte // 4 (MQTT 3.1.1) or 5
}

// dialRaw connects as clientID with clean session off, over MQTT 3.1.1.
func dialRaw(t *testing.T, b *Broker, clientID string) *rawClient {
	t.Helper()
	return dialRawWith(t, b, 4, packets.ConnectParams{ClientIdentifier: clientID})
}

// dialRawWith connects with the given CONNECT parameters (and, for
// version 5, properties) over MQTT version 4 or 5.
func dialRawWith(t *testing.T, b *Broker, version byte, cp packets.ConnectParams, props ...packets.Properties) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", b.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() }) // closed by the test already, or at its end
	c := &rawClient{t: t, nc: nc, r: bufio.NewReader(nc), version: version}
	cp.Keepalive = 60
	connect := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Connect}, Connect: cp}
	if len(props) > 0 {
		connect.Properties = props[0]
	}
	c.send(connect)
	if pk := c.read(); pk.FixedHeader.Type != packets.Connack || pk.ReasonCode != 0 {
		t.Fatalf("CONNACK: %+v", pk)
	}
	return c
}

func (c *rawClient) send(pk packets.Packet) {
	c.t.Helper()
	pk.ProtocolVersion = c.version
	if pk.FixedHeader.Type == packets.Connect {
		pk.Connect.ProtocolName = []byte("MQTT")
	}
	var buf bytes.Buffer
	var err error
	switch pk.FixedHeader.Type {
	case packets.Connect:
		err = pk.ConnectEncode(&buf)
	case packets.Subscribe:
		pk.FixedHeader.Qos = 1 // the flags SUBSCRIBE must carry
		err = pk.SubscribeEncode(&buf)
	case packets.Unsubscribe:
		pk.FixedHeader.Qos = 1
		err = pk.UnsubscribeEncode(&buf)
	case packets.Publish:
		err = pk.PublishEncode(&buf)
	case packets.Puback:
		err = pk.PubackEncode(&buf)
	case packets.Pingreq:
		err = pk.PingreqEncode(&buf)
	default:
		c.t.Fatalf("rawClient cannot send %d", pk.FixedHeader.Type)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.nc.Write(buf.Bytes()); err != nil {
		c.t.Fatal(err)
	}
}

// read reads the next packet, within 5 s.
func (c *rawClient) read() packets.Packet {
	c.t.Helper()
	_ = c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	hb, err := c.r.ReadByte()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	var pk packets.Packet
	pk.ProtocolVersion = c.version
	if err := pk.FixedHeader.Decode(hb); err != nil {
		c.t.Fatal(err)
	}
	n, _, err := packets.DecodeLength(c.r)
	if err != nil {
		c.t.Fatal(err)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.r, body); err != nil {
		c.t.Fatal(err)
	}
	switch pk.FixedHeader.Type {
	case packets.Connack:
		err = pk.ConnackDecode(body)
	case packets.Publish:
		err = pk.PublishDecode(body)
	case packets.Puback:
		err = pk.PubackDecode(body)
	case packets.Pubrec:
		err = pk.PubrecDecode(body)
	case packets.Suback:
		err = pk.SubackDecode(body)
	case packets.Unsuback:
		err = pk.UnsubackDecode(body)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return pk
}

// expect reads the next packet and checks its type and identifier.
func (c *rawClient) expect(typ byte, id uint16) packets.Packet {
	c.t.Helper()
	pk := c.read()
	if pk.FixedHeader.Type != typ || pk.PacketID != id {
		c.t.Fatalf("got packet type %d id %d, want type %d id %d (%+v)", pk.FixedHeader.Type, pk.PacketID, typ, id, pk)
	}
	return pk
}

func subscribe(id uint16, filter string) packets.Packet {
	return packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Subscribe}, PacketID: id, Filters: packets.Subscriptions{{Filter: filter, Qos: 1}}}
}

// TestClientPacketIDsAreIndependentOfTheBrokers: a client may number a
// SUBSCRIBE, an UNSUBSCRIBE or a QoS 1 PUBLISH with the identifier of a
// delivery the broker has outstanding to it (MQTT 3.1.1 section 2.3.1:
// each side assigns its own). Each is answered under the client's
// number, and the delivery is still owed: sent again on the next
// connection of the session. (mochi alone refused the SUBSCRIBE with
// 0x91, and dropped the delivery on the PUBLISH.)
func TestClientPacketIDsAreIndependentOfTheBrokers(t *testing.T) {
	b := startTest(t)
	c := dialRaw(t, b, "agent")
	c.send(subscribe(1, "triggers"))
	c.expect(packets.Suback, 1)
	if err := b.Publish("triggers", []byte("go_home"), false, 1); err != nil {
		t.Fatal(err)
	}
	d := c.read() // not acknowledged: the broker holds it in flight
	if d.FixedHeader.Type != packets.Publish || d.PacketID == 0 {
		t.Fatalf("delivery: %+v", d)
	}
	id := d.PacketID

	c.send(subscribe(id, "more"))
	if ack := c.expect(packets.Suback, id); len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != 1 {
		t.Errorf("SUBSCRIBE numbered like the delivery: SUBACK codes %x, want granted QoS 1", ack.ReasonCodes)
	}
	if !b.Subscribed("more") {
		t.Error("the SUBSCRIBE answered made no subscription")
	}
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Unsubscribe}, PacketID: id, Filters: packets.Subscriptions{{Filter: "more"}}})
	c.expect(packets.Unsuback, id)
	if b.Subscribed("more") {
		t.Error("the UNSUBSCRIBE answered left the subscription")
	}
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: id, TopicName: "replies", Payload: []byte("ok")})
	c.expect(packets.Puback, id)
	// mochi keeps its PUBACK in the session's in-flight table from just
	// before writing it to just after; a takeover in between copies it,
	// and the next connection gets it again (under the stand-in number,
	// which the client does not use). The PINGREQ waits that out.
	c.ping()

	// The delivery was never acknowledged: the session owes it.
	_ = c.nc.Close()
	c = dialRaw(t, b, "agent")
	again := c.read()
	if again.FixedHeader.Type != packets.Publish || string(again.Payload) != "go_home" {
		t.Fatalf("after reconnecting, got %+v; want the delivery sent again", again)
	}
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: again.PacketID})
}

// TestSubackToMQTT311ClientCarriesOnlyItsCodes: a SUBSCRIBE numbered
// like the client's own QoS 2 PUBLISH still in flight is refused, as it
// should be, and to an MQTT 3.1.1 client with 0x80, the one failure code
// 3.1.1 has (MQTT-3.9.3-2), not MQTT 5's 0x91.
func TestSubackToMQTT311ClientCarriesOnlyItsCodes(t *testing.T) {
	b := startTest(t)
	c := dialRaw(t, b, "qos2")
	c.send(packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 2}, PacketID: 7, TopicName: "x", Payload: []byte("p")})
	if pk := c.read(); pk.FixedHeader.Type != packets.Pubrec || pk.PacketID != 7 {
		t.Fatalf("PUBREC: %+v", pk)
	}
	c.send(subscribe(7, "y"))
	if ack := c.expect(packets.Suback, 7); len(ack.ReasonCodes) != 1 || ack.ReasonCodes[0] != 0x80 {
		t.Errorf("SUBACK codes %x, want 80", ack.ReasonCodes)
	}
}
