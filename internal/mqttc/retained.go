package mqttc

// SubscribeRetained is Subscribe at QoS 1 for a handler that needs the
// message's retain flag. Over MQTT 3.1.1 the broker sets it only on the
// copies of retained messages it replays when a subscription is made
// (at the first connection and at every reconnection), never on a
// message it forwards as it is published: a device adapter can tell a
// state report that answers its command from an old one replayed.
func (c *Client) SubscribeRetained(filter string, handle func(topic string, payload []byte, retained bool)) (cancel func(), err error) {
	return c.add(&sub{filter: filter, qos: 1, handleMsg: handle})
}
