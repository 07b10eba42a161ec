package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"

	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/internal/mqttlog"
)

// link is the agent's way to the broker for triggers, replies and events
// (device traffic has its own, in devices.Client): an MQTT connection, or
// calls into the embedded broker.
type link interface {
	// Subscribe calls handle for every message on topic; handle must not
	// block.
	Subscribe(topic string, handle func(topic string, payload []byte)) error
	// Publish returns once the broker has taken the message.
	Publish(topic string, qos byte, retained bool, payload []byte) error
	Close()
}

// localLink is a link to the embedded broker in this process.
type localLink struct {
	b       devices.Local
	mu      sync.Mutex
	cancels []func()
}

func (l *localLink) Subscribe(topic string, handle func(string, []byte)) error {
	cancel, err := l.b.Subscribe(topic, handle)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.cancels = append(l.cancels, cancel)
	l.mu.Unlock()
	return nil
}

func (l *localLink) Publish(topic string, qos byte, retained bool, payload []byte) error {
	if err := l.b.Publish(topic, payload, retained, qos); err != nil {
		return fmt.Errorf("publish %s: %w", topic, err)
	}
	return nil
}

func (l *localLink) Close() {
	l.mu.Lock()
	cancels := l.cancels
	l.cancels = nil
	l.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
}

// conn is a link over an MQTT connection. Subscriptions are made in the
// on-connect handler so that reconnects restore them.
type conn struct {
	c    mqtt.Client
	log  *slog.Logger
	mu   sync.Mutex
	subs map[string]mqtt.MessageHandler
}

type connOptions struct {
	URL, ClientID, Username, Password string
	TLS                               *tls.Config
	// Will, if set, is published by the broker when the connection dies.
	WillTopic   string
	WillPayload []byte
	// OnConnect runs after every (re)connection, after subscriptions.
	OnConnect func()
	Log       *slog.Logger
}

const tokenWait = 10 * time.Second

func dialConn(ctx context.Context, o connOptions) (*conn, error) {
	cn := &conn{log: o.Log, subs: map[string]mqtt.MessageHandler{}}
	opts := mqtt.NewClientOptions().
		AddBroker(o.URL).
		SetClientID(o.ClientID).
		SetUsername(o.Username).
		SetPassword(o.Password).
		SetCleanSession(true).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(500 * time.Millisecond).
		SetMaxReconnectInterval(10 * time.Second).
		SetKeepAlive(30 * time.Second).
		SetOrderMatters(false).
		SetConnectTimeout(5 * time.Second)
	if o.TLS != nil {
		opts.SetTLSConfig(o.TLS)
	}
	if o.WillTopic != "" {
		opts.SetBinaryWill(o.WillTopic, o.WillPayload, 1, true)
	}
	opts.SetOnConnectHandler(func(c mqtt.Client) {
		cn.mu.Lock()
		subs := make(map[string]mqtt.MessageHandler, len(cn.subs))
		for k, v := range cn.subs {
			subs[k] = v
		}
		cn.mu.Unlock()
		// Subscribing waits for the broker; do it off the paho callback.
		go func() {
			for topic, h := range subs {
				tok := c.Subscribe(topic, 1, h)
				if !tok.WaitTimeout(tokenWait) || tok.Error() != nil {
					cn.log.Error("resubscribe", "topic", topic, "err", tokenErr(tok))
				} else if err := subscribeResult(tok, topic); err != nil {
					cn.log.Error("resubscribe", "topic", topic, "err", err)
				}
			}
			if o.OnConnect != nil {
				o.OnConnect()
			}
		}()
	})
	opts.SetConnectionLostHandler(func(_ mqtt.Client, err error) {
		cn.log.Warn("mqtt connection lost; reconnecting", "err", err)
	})
	opts.SetConnectionNotificationHandler(mqttlog.Failures(o.Log, "cannot connect to the broker; retrying", o.URL, 30*time.Second))
	cn.c = mqtt.NewClient(opts)
	tok := cn.c.Connect()
	select {
	case <-tok.Done():
		if err := tok.Error(); err != nil {
			return nil, fmt.Errorf("connect %s: %w", o.URL, err)
		}
	case <-ctx.Done():
		cn.c.Disconnect(0)
		return nil, fmt.Errorf("connect %s: %w", o.URL, ctx.Err())
	}
	return cn, nil
}

func tokenErr(tok mqtt.Token) error {
	if err := tok.Error(); err != nil {
		return err
	}
	return errors.New("timed out")
}

// Subscribe subscribes now and after every reconnect.
func (cn *conn) Subscribe(topic string, handle func(string, []byte)) error {
	h := func(_ mqtt.Client, m mqtt.Message) { handle(m.Topic(), m.Payload()) }
	cn.mu.Lock()
	cn.subs[topic] = h
	cn.mu.Unlock()
	tok := cn.c.Subscribe(topic, 1, h)
	if !tok.WaitTimeout(tokenWait) || tok.Error() != nil {
		return fmt.Errorf("subscribe %s: %w", topic, tokenErr(tok))
	}
	return subscribeResult(tok, topic)
}

// subscribeResult turns a refused subscription into an error: paho reports
// a SUBACK failure code (0x80) as success.
func subscribeResult(tok mqtt.Token, topic string) error {
	if st, ok := tok.(*mqtt.SubscribeToken); ok {
		if code, ok := st.Result()[topic]; ok && code >= 0x80 {
			return fmt.Errorf("subscribe %s: broker refused (code %#x)", topic, code)
		}
	}
	return nil
}

// Publish sends a message and waits for the broker to take it (QoS 1).
func (cn *conn) Publish(topic string, qos byte, retained bool, payload []byte) error {
	tok := cn.c.Publish(topic, qos, retained, payload)
	if !tok.WaitTimeout(tokenWait) || tok.Error() != nil {
		return fmt.Errorf("publish %s: %w", topic, tokenErr(tok))
	}
	return nil
}

// Close disconnects, letting queued messages go out first.
func (cn *conn) Close() {
	cn.c.Disconnect(250)
}
