// Package brokertest starts embedded brokers for tests, the way
// net/http/httptest starts servers. Only tests import it, so the
// binaries do not link package testing.
package brokertest

import (
	"testing"

	"github.com/sortie-edge/sortie/broker"
)

// Start starts a broker on a free port of 127.0.0.1 that lets every
// client in, and closes it when the test ends.
func Start(tb testing.TB) *broker.Broker {
	tb.Helper()
	return StartWith(tb, broker.Options{})
}

// StartWith starts a broker with opts on a free port of 127.0.0.1 (any
// Addr in opts is replaced) and closes it when the test ends.
func StartWith(tb testing.TB, opts broker.Options) *broker.Broker {
	tb.Helper()
	opts.Addr = "127.0.0.1:0"
	b, err := broker.Start(opts)
	if err != nil {
		tb.Fatalf("start broker: %v", err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Errorf("close broker: %v", err)
		}
	})
	return b
}
