package hub

import "errors"

// Errors returned by the hub. The API maps each to an HTTP status.
var (
	// ErrNotFound: no such mission.
	ErrNotFound = errors.New("not found")
	// ErrUnknownGateway: the gateway has never been seen nor configured.
	ErrUnknownGateway = errors.New("unknown gateway")
	// ErrOffline: the gateway is not connected, so a control request
	// would only time out.
	ErrOffline = errors.New("gateway offline")
	// ErrInvalid: a request or message is malformed.
	ErrInvalid = errors.New("invalid request")
	// ErrTimeout: a control request got no result in time. The gateway
	// may still act on it.
	ErrTimeout = errors.New("control result timed out")
	// ErrNotConnected: the hub has no MQTT connection right now.
	ErrNotConnected = errors.New("hub not connected to broker")
	// ErrClosed: the store is closed.
	ErrClosed = errors.New("store closed")
	// ErrStoreUnavailable: the cluster mode's PostgreSQL cannot be
	// reached now (down, restarting, a connection cut); a retry may work.
	ErrStoreUnavailable = errors.New("database unavailable")
	// ErrNotLeader: in the cluster mode, another replica drives the
	// rollouts (or none does at this moment); ask again, or another one.
	ErrNotLeader = errors.New("this replica does not drive the rollouts now")
	// ErrSchemaNewer: a newer hub migrated the cluster mode's database
	// past the schema this one knows, which it would misread.
	ErrSchemaNewer = errors.New("the database's schema is newer than this hub")
)
