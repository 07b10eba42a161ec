package agent

import "crypto/tls"

// homeConn is how a simulated home's devices reach the agent's broker.
type homeConn struct {
	broker, user, password string
	tls                    *tls.Config
}
