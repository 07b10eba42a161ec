module github.com/sortie-edge/sortie

go 1.26.0

require (
	github.com/BurntSushi/toml v1.6.0 // indirect
	github.com/eclipse/paho.mqtt.golang v1.5.1 // indirect
	github.com/gorilla/websocket v1.5.3 // indirect
	github.com/mochi-mqtt/server/v2 v2.7.9 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/rs/xid v1.4.0 // indirect
	go.etcd.io/bbolt v1.5.0 // indirect
	golang.org/x/net v0.59.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
