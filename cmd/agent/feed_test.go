package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sortie-edge/sortie/driver"
)

type chanPublisher chan string

func (c chanPublisher) Publish(topic string, _ byte, _ bool, payload []byte) error {
	c <- topic + " " + string(payload)
	return nil
}

// TestFeedSkipsUnfollowedEvents: with the embedded broker, an event no
// client subscribes to is not published; one that is followed is.
func TestFeedSkipsUnfollowedEvents(t *testing.T) {
	pub := make(chanPublisher, 4)
	f := newFeed(slog.New(slog.NewTextHandler(io.Discard, nil)), pub, newAgentTopics("sortie", "home"), "home")
	var asked atomic.Int32
	f.listened = func(topic string) bool {
		asked.Add(1)
		return strings.Contains(topic, "/missions/m2/")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	defer func() { cancel(); <-done }()

	ev := func(id string) (driver.Event, *driver.Mission) {
		return driver.Event{MissionID: id, Seq: 1, Input: driver.InBeginStep, To: driver.StateStepRunning, Time: time.Now()},
			&driver.Mission{ID: id, Type: "go_home", Steps: make([]driver.Step, 3)}
	}
	f.Observe(ev("m1")) // nobody follows m1
	f.Observe(ev("m2"))
	select {
	case got := <-pub:
		var msg eventMsg
		topic, payload, _ := strings.Cut(got, " ")
		if err := json.Unmarshal([]byte(payload), &msg); err != nil || msg.MissionID != "m2" || topic != "sortie/gateways/home/missions/m2/events" {
			t.Errorf("published %q (%v), want m2's event on its events topic", got, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a followed event was not published")
	}
	// The queue is in order: m1's event was looked at first.
	if n := asked.Load(); n != 2 {
		t.Errorf("listened asked %d times, want 2", n)
	}
}
