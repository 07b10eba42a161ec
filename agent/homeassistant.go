package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sortie-edge/sortie/driver"
	"github.com/sortie-edge/sortie/scenes"
)

// HomeAssistantOptions make the agent show up in Home Assistant through
// its MQTT discovery: a button per scene that runs it, and a sensor per
// scene with its last run's state and reason (docs/devices.md).
type HomeAssistantOptions struct {
	// Prefix is Home Assistant's discovery prefix; "" means
	// "homeassistant".
	Prefix string
	// Version is the agent's, shown on the device Home Assistant lists.
	Version string
}

// homeAssistant announces the scenes to Home Assistant, runs a scene
// when its button is pressed, and publishes each scene's last run. It
// is an observer of the driver.
type homeAssistant struct {
	log  *slog.Logger
	link link
	// cat is the catalog announced; a bundle applied replaces it
	// (setCatalog).
	cat atomic.Pointer[scenes.Catalog]
	// enqueue hands a trigger's payload to the trigger service's queue,
	// as one from MQTT: it never blocks.
	enqueue func(payload []byte)
	prefix  string // Home Assistant's discovery prefix
	base    string // <sortie prefix>/gateways/<gw>/ha
	node    string // sortie_<gw>, as a discovery node id
	gateway string
	version string
	now     func() time.Time

	mu      sync.Mutex
	cancels []func()
	// last holds each scene's last run not yet published, and wake says
	// there is some: Observe must not block on the link, and only the
	// latest run of a scene matters.
	last map[string][]byte
	wake chan struct{}
	// reannounce and gone are work the link's handlers leave to Run:
	// they must not block on publishing.
	reannounce bool
	gone       []string
}

func newHomeAssistant(o HomeAssistantOptions, log *slog.Logger, conn link, cat *scenes.Catalog, topics agentTopics, gateway string,
	enqueue func([]byte), now func() time.Time) *homeAssistant {
	prefix := o.Prefix
	if prefix == "" {
		prefix = "homeassistant"
	}
	h := &homeAssistant{
		log: log, link: conn, enqueue: enqueue, prefix: prefix, gateway: gateway, version: o.Version, now: now,
		base: topics.base + "/ha", node: "sortie_" + discoveryID(gateway),
		last: make(map[string][]byte), wake: make(chan struct{}, 1),
	}
	h.cat.Store(cat)
	return h
}

// discoveryID keeps what Home Assistant takes in a node or object id:
// letters, digits, '_' and '-'.
func discoveryID(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}

// AvailabilityTopic is where the agent says it is online (retained, and
// "offline" when it stops or, over a network link, as its will).
func (h *homeAssistant) AvailabilityTopic() string { return h.base + "/availability" }

func (h *homeAssistant) runTopic(scene string) string   { return h.base + "/run/" + scene }
func (h *homeAssistant) stateTopic(scene string) string { return h.base + "/scene/" + scene }
func (h *homeAssistant) configTopic(component, scene, suffix string) string {
	return h.prefix + "/" + component + "/" + h.node + "/" + discoveryID(scene) + suffix + "/config"
}

// start subscribes to button presses, to Home Assistant's birth (which
// asks for every config again) and to the retained configs of this
// gateway (a scene no longer in the catalog has its entities removed),
// then announces every scene and the agent online.
func (h *homeAssistant) start() error {
	subs := map[string]func(string, []byte){
		h.base + "/run/+": h.pressed,
		h.prefix + "/status": func(_ string, p []byte) {
			if string(p) == "online" {
				h.mu.Lock()
				h.reannounce = true
				h.mu.Unlock()
				h.poke()
			}
		},
		h.prefix + "/button/" + h.node + "/+/config": h.stale,
		h.prefix + "/sensor/" + h.node + "/+/config": h.stale,
	}
	for filter, handle := range subs {
		cancel, err := h.link.Subscribe(filter, handle)
		if err != nil {
			return fmt.Errorf("home assistant: subscribe %s: %w", filter, err)
		}
		h.mu.Lock()
		h.cancels = append(h.cancels, cancel)
		h.mu.Unlock()
	}
	h.announce()
	h.removeGone()
	return nil
}

// setCatalog announces cat's scenes instead of the running catalog's,
// from Run: those it no longer has lose their entities.
func (h *homeAssistant) setCatalog(cat *scenes.Catalog) {
	old := h.cat.Swap(cat)
	h.mu.Lock()
	for _, name := range old.Names() {
		if _, ok := cat.Scene(name); !ok && len(h.gone) < 1000 {
			h.gone = append(h.gone, h.configTopic("button", name, ""), h.configTopic("sensor", name, "_last"))
		}
	}
	h.reannounce = true
	h.mu.Unlock()
	h.poke()
}

// poke wakes Run.
func (h *homeAssistant) poke() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// removeGone removes the entities of scenes no longer in the catalog
// (an empty retained config deletes an entity in Home Assistant).
func (h *homeAssistant) removeGone() {
	h.mu.Lock()
	gone := h.gone
	h.gone = nil
	h.mu.Unlock()
	for _, topic := range gone {
		if err := h.link.Publish(topic, nil, true, 1); err != nil {
			h.log.Warn("home assistant: stale config not removed", "topic", topic, "err", err)
			continue
		}
		h.log.Info("home assistant: removed the entity of a scene that is gone", "topic", topic)
	}
}

// stop says the agent is offline and forgets its subscriptions.
func (h *homeAssistant) stop() {
	h.mu.Lock()
	cancels := h.cancels
	h.cancels = nil
	h.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	if err := h.link.Publish(h.AvailabilityTopic(), []byte("offline"), true, 1); err != nil {
		h.log.Debug("home assistant: offline not published", "err", err)
	}
}

// announce publishes every scene's button and sensor configs, retained,
// and the agent online.
func (h *homeAssistant) announce() {
	dev := map[string]any{"ids": []string{h.node}, "name": "Sortie " + h.gateway, "mf": "Sortie", "mdl": "mission-driven edge agent", "sw": h.version}
	for _, name := range h.cat.Load().Names() {
		id := h.node + "_" + discoveryID(name)
		button := map[string]any{
			"name": name, "uniq_id": id + "_run", "cmd_t": h.runTopic(name), "pl_prs": "PRESS",
			"avty_t": h.AvailabilityTopic(), "ic": "mdi:play-circle-outline", "dev": dev, "o": map[string]string{"name": "Sortie"},
		}
		sensor := map[string]any{
			"name": name + " last run", "uniq_id": id + "_last", "stat_t": h.stateTopic(name), "val_tpl": "{{ value_json.state }}",
			"json_attr_t": h.stateTopic(name), "avty_t": h.AvailabilityTopic(), "ic": "mdi:clipboard-check-outline", "dev": dev,
			"o": map[string]string{"name": "Sortie"},
		}
		for topic, cfg := range map[string]map[string]any{h.configTopic("button", name, ""): button, h.configTopic("sensor", name, "_last"): sensor} {
			b, _ := json.Marshal(cfg) // maps of strings always encode
			if err := h.link.Publish(topic, b, true, 1); err != nil {
				h.log.Warn("home assistant: config not published", "topic", topic, "err", err)
			}
		}
	}
	if err := h.link.Publish(h.AvailabilityTopic(), []byte("online"), true, 1); err != nil {
		h.log.Warn("home assistant: availability not published", "err", err)
	}
}

// stale marks for removal the entities of a scene the catalog no
// longer has; Run (or start) removes them.
func (h *homeAssistant) stale(topic string, payload []byte) {
	if len(payload) == 0 {
		return
	}
	for _, name := range h.cat.Load().Names() {
		if topic == h.configTopic("button", name, "") || topic == h.configTopic("sensor", name, "_last") {
			return
		}
	}
	h.mu.Lock()
	if len(h.gone) < 1000 {
		h.gone = append(h.gone, topic)
	}
	h.mu.Unlock()
	h.poke()
}

// pressed runs the scene whose button was pressed, with a request ID of
// its own, through the trigger service's queue as a trigger from MQTT:
// modes, idempotency, the reply on replies/<request id> and why are the
// same. It runs on the link's receive path and never blocks.
func (h *homeAssistant) pressed(topic string, payload []byte) {
	scene := strings.TrimPrefix(topic, h.base+"/run/")
	if _, ok := h.cat.Load().Scene(scene); string(payload) != "PRESS" || !ok {
		h.log.Debug("home assistant: press ignored", "topic", topic, "payload", string(payload))
		return
	}
	tr := scenes.Trigger{Scene: scene, RequestID: fmt.Sprintf("ha-%s-%d", discoveryID(scene), h.now().UnixNano()), Source: "homeassistant"}
	b, _ := json.Marshal(tr) // strings always encode
	h.enqueue(b)
}

// Observe publishes a scene's last run when a mission ends.
func (h *homeAssistant) Observe(ev driver.Event, m *driver.Mission) {
	if _, ok := h.cat.Load().Scene(m.Type); !ev.To.Terminal() || !ok {
		return
	}
	b, _ := json.Marshal(map[string]any{ // strings and times always encode
		"state": string(ev.To), "reason": m.Reason, "error": m.Error, "mission": m.ID,
		"source": m.Meta.Source, "finished": ev.Time.UTC().Format(time.RFC3339),
	})
	h.mu.Lock()
	h.last[m.Type] = b
	h.mu.Unlock()
	h.poke()
}

// Run publishes the scenes' last runs as Observe records them, until ctx
// ends.
func (h *homeAssistant) Run(ctx context.Context) error {
	for {
		select {
		case <-h.wake:
		case <-ctx.Done():
			return nil
		}
		h.mu.Lock()
		last, again := h.last, h.reannounce
		h.last, h.reannounce = make(map[string][]byte), false
		h.mu.Unlock()
		if again {
			h.announce()
		}
		h.removeGone()
		for scene, b := range last {
			if err := h.link.Publish(h.stateTopic(scene), b, true, 1); err != nil {
				h.log.Debug("home assistant: last run not published", "scene", scene, "err", err)
			}
		}
	}
}
