// Package mqttlog holds what the agent's and the uplink's paho
// connections share: with ConnectRetry, paho retries a failing connection
// silently, and a wrong password or URL must still show in the log.
package mqttlog

import (
	"log/slog"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
)

// Failures returns a connection-notification handler that logs failed
// connection attempts with their reason, at most once per every.
func Failures(log *slog.Logger, msg, broker string, every time.Duration) mqtt.ConnectionNotificationHandler {
	var last atomic.Int64
	return func(_ mqtt.Client, n mqtt.ConnectionNotification) {
		f, ok := n.(mqtt.ConnectionNotificationFailed)
		if !ok {
			return
		}
		now, prev := time.Now().UnixNano(), last.Load()
		if now-prev >= int64(every) && last.CompareAndSwap(prev, now) {
			log.Warn(msg, "broker", broker, "err", f.Reason)
		}
	}
}
