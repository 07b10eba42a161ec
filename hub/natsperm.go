package hub

import (
	"strings"

	"github.com/sortie-edge/sortie/uplink"
)

// NATSPermissions is what a NATS user may publish and subscribe to
// (subjects, wildcards allowed), as nats-server's permissions block
// takes them.
type NATSPermissions struct {
	Publish, Subscribe []string
}

// HubNATSPermissions are the hub replicas' NATS user's permissions
// under topic prefix prefix ("" for uplink.DefaultPrefix): the
// JetStream API, acks to the streams, and the hub's own subjects.
func HubNATSPermissions(prefix string) NATSPermissions {
	root := hubSubjectRoot(prefix) + ".>"
	return NATSPermissions{
		Publish:   []string{"$JS.API.>", "$JS.ACK.>", root},
		Subscribe: []string{"_INBOX.>", root},
	}
}

// GatewayNATSPermissions are gateway gw's: its own topics only, as MQTT
// maps them to subjects (a "." in the ID is "//").
func GatewayNATSPermissions(prefix, gw string) NATSPermissions {
	t := uplink.Topics{Prefix: prefix}
	s := func(topic string) string { return topicToSubject(topic) }
	return NATSPermissions{
		Publish:   []string{s(t.Status(gw)), s(t.Heartbeat(gw)), s(t.Events(gw)), s(t.Traces(gw)), s(t.ControlResult(gw))},
		Subscribe: []string{s(t.Ack(gw)), s(t.Control(gw))},
	}
}

// hubSubjectRoot is the subject every hub topic is under: "sortie.hub".
func hubSubjectRoot(prefix string) string {
	return topicToSubject(strings.TrimSuffix(uplink.Topics{Prefix: prefix}.Status(""), "/gateways//status"))
}
