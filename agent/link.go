package agent

import (
	"crypto/tls"
	"log/slog"

	"github.com/sortie-edge/sortie/internal/mqttc"
)

// link is the agent's way to the broker for triggers, replies and events
// (device traffic has its own, in devices.Client): the embedded broker
// called in process (*broker.Broker), or a connection to an external one
// (*mqttc.Client). Both have these two methods, so Start does not care
// which it has.
type link interface {
	// Publish returns once the broker has taken the message.
	Publish(topic string, payload []byte, retained bool, qos byte) error
	// Subscribe calls handle for every message on a topic matching filter
	// until cancel; handle must not block.
	Subscribe(filter string, handle func(topic string, payload []byte)) (cancel func(), err error)
}

// linkPublisher is a link as the Publisher that the trigger service and
// the event feed take.
type linkPublisher struct{ l link }

func (p linkPublisher) Publish(topic string, qos byte, retained bool, payload []byte) error {
	return p.l.Publish(topic, payload, retained, qos)
}

// newLink makes the agent's own connection to an external broker, to be
// connected (mqttc.Client.Connect, which retries until its ctx ends) once
// its subscriptions are recorded; the connection then comes back by
// itself and keeps its subscriptions, and its session keeps the
// triggers published while it is away.
func newLink(url, clientID, user, password string, tlsCfg *tls.Config, will *mqttc.Will, log *slog.Logger) (*mqttc.Client, error) {
	return mqttc.New(mqttc.Options{
		Broker: url, ClientID: clientID, Username: user, Password: password, TLS: tlsCfg, Logger: log, Will: will,
		// Triggers an app publishes while the agent is away (a broker
		// restart, the agent's own) wait in the session for it.
		Persistent: true,
	})
}
