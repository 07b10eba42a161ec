package mqttlog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

func TestFailuresAreRateLimited(t *testing.T) {
	var buf bytes.Buffer
	h := Failures(slog.New(slog.NewTextHandler(&buf, nil)), "cannot connect", "tcp://x:1", time.Hour)
	for range 3 {
		h(nil, mqtt.ConnectionNotificationFailed{Reason: errors.New("not Authorized")})
	}
	h(nil, mqtt.ConnectionNotificationConnected{})
	if n := strings.Count(buf.String(), "cannot connect"); n != 1 {
		t.Fatalf("logged %d times, want 1:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "not Authorized") || !strings.Contains(buf.String(), "tcp://x:1") {
		t.Errorf("log lacks the reason or broker: %s", buf.String())
	}
}
