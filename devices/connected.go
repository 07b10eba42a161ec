package devices

// Connected reports whether the client is connected and subscribed, for
// health checks and the broker_connected metric.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.connected && !c.closed
}
