package hub

import (
	"fmt"
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
func HubNATSPermissions(prefix string) (NATSPermissions, error) {
	if err := checkNATSLiteral("prefix", prefix); err != nil {
		return NATSPermissions{}, err
	}
	root := hubSubjectRoot(prefix) + ".>"
	return NATSPermissions{
		Publish:   []string{"$JS.API.>", "$JS.ACK.>", root},
		Subscribe: []string{"_INBOX.>", root},
	}, nil
}

// GatewayNATSPermissions are gateway gw's: its own topics only, as MQTT
// maps them to subjects (a "." in the ID is "//").
func GatewayNATSPermissions(prefix, gw string) (NATSPermissions, error) {
	if err := checkNATSLiteral("prefix", prefix); err != nil {
		return NATSPermissions{}, err
	}
	if err := checkNATSLiteral("gateway", gw); err != nil {
		return NATSPermissions{}, err
	}
	t := uplink.Topics{Prefix: prefix}
	s := func(topic string) string { return topicToSubject(topic) }
	return NATSPermissions{
		Publish:   []string{s(t.Status(gw)), s(t.Heartbeat(gw)), s(t.Events(gw)), s(t.Traces(gw)), s(t.ControlResult(gw)), s(t.BundleStatus(gw))},
		Subscribe: []string{s(t.Ack(gw)), s(t.Control(gw))},
	}, nil
}

// checkNATSLiteral refuses a name that would put a wildcard in a
// permission: a gateway called "*" would be allowed every gateway's
// subjects.
func checkNATSLiteral(what, name string) error {
	if strings.ContainsAny(name, "*>") {
		return fmt.Errorf("%w: %s %q: NATS reads * and > in a subject as wildcards", ErrInvalid, what, name)
	}
	return nil
}

// hubSubjectRoot is the subject every hub topic is under: "sortie.hub".
func hubSubjectRoot(prefix string) string {
	return topicToSubject(strings.TrimSuffix(uplink.Topics{Prefix: prefix}.Status(""), "/gateways//status"))
}
