package devices_test

import (
	"testing"
	"time"

	"github.com/sortie-edge/sortie/broker/brokertest"
	"github.com/sortie-edge/sortie/devices"
	"github.com/sortie-edge/sortie/devices/wire"
)

// TestInProcess runs the tests that do not depend on the connection with
// the client talking to the broker in process, as the agent does with its
// embedded broker. (Reconnection and dialing have nothing to test there.)
func TestInProcess(t *testing.T) {
	inProcess = true
	defer func() { inProcess = false }()
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"SendAck", TestSendAck},
		{"RetryAfterLostAck", TestRetryAfterLostAck},
		{"Rejections", TestRejections},
		{"LateAckCompletesRetry", TestLateAckCompletesRetry},
		{"DuplicateAckIgnored", TestDuplicateAckIgnored},
		{"AckFromOtherDeviceIgnored", TestAckFromOtherDeviceIgnored},
		{"ConcurrentSends", TestConcurrentSends},
		{"SameIDInFlight", TestSameIDInFlight},
		{"InvalidRejectedBeforePublish", TestInvalidRejectedBeforePublish},
		{"AvailabilityAndState", TestAvailabilityAndState},
		{"MalformedAndUnknownAcksAreCountedAndSparTheCommandInFlight", TestMalformedAndUnknownAcksAreCountedAndSparTheCommandInFlight},
		{"AckOfAForgottenCommandIsUnknownNotLate", TestAckOfAForgottenCommandIsUnknownNotLate},
		{"AckOfAPostGivenUpOnIsLate", TestAckOfAPostGivenUpOnIsLate},
	} {
		t.Run(tc.name, tc.f)
	}
}

// What a device retained before the client existed is known once Dial
// returns, and Close ends the subscriptions.
func TestInProcessRetainedAndClose(t *testing.T) {
	b := brokertest.Start(t)
	startDevice(t, b, "lamp", map[string]any{"power": "on"}, nil)
	if err := b.Publish(wire.Topics{}.Availability("door"), []byte(wire.Offline), true, 1); err != nil {
		t.Fatal(err)
	}
	c, err := devices.Dial(t.Context(), devices.Options{Local: b, Logger: discard()})
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := c.State("lamp"); !ok || st["power"] != "on" {
		t.Errorf("state at Dial = %v, %v; want the retained report", st, ok)
	}
	if c.Available("door") {
		t.Error("door counts as available; its retained availability says offline")
	}
	if !c.Connected() {
		t.Error("not connected")
	}
	if !b.Subscribed(wire.Topics{}.State("lamp")) {
		t.Fatal("no subscription to lamp's state")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if b.Subscribed(wire.Topics{}.State("lamp")) {
		t.Error("Close left the state subscription in place")
	}
	if c.Connected() {
		t.Error("connected after Close")
	}
	if _, err := send(t.Context(), c, "lamp", wire.Command{ID: "a1", Action: "turn_on"}); err == nil {
		t.Error("Send after Close succeeded")
	}
}

// Close waits for a hook already running on the broker's receive path,
// and no hook runs after it returns.
func TestInProcessCloseWaitsForHandlers(t *testing.T) {
	b := brokertest.Start(t)
	entered, release := make(chan string, 8), make(chan struct{})
	c, err := devices.Dial(t.Context(), devices.Options{Local: b, Logger: discard(), OnChange: func(id string) {
		entered <- id
		<-release
	}})
	if err != nil {
		t.Fatal(err)
	}
	topics := wire.Topics{}
	go func() {
		if err := b.Publish(topics.Availability("lamp"), []byte(wire.Online), false, 1); err != nil {
			t.Errorf("publish availability: %v", err)
			entered <- "(nothing published)"
		}
	}()
	if id := <-entered; id != "lamp" {
		t.Fatalf("OnChange(%q), want lamp", id)
	}
	closed := make(chan struct{})
	go func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a hook was still running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	if err := b.Publish(topics.Availability("door"), []byte(wire.Online), false, 1); err != nil {
		t.Fatal(err)
	}
	select {
	case id := <-entered:
		t.Fatalf("OnChange(%q) after Close", id)
	default:
	}
}
