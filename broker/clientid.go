package broker

// owners keeps each MQTT client ID of an embedded broker to one user at a
// time. mochi hands a client ID's session, live or kept
// for later, with its subscriptions and queued messages, to the newest
// connection that names it; without owners, any user could knock another
// off by its client ID, or take its kept session and the messages queued
// in it. Auth uses it.

import (
	"strings"
	"sync"

	mqtt "github.com/mochi-mqtt/server/v2"
)

// owners records who holds each client ID in use. Safe for concurrent
// use.
type owners struct {
	// reserved names the user a client ID belongs to whoever holds it
	// now ("" for none).
	reserved func(clientID string) string
	srv      *mqtt.Server
	mu       sync.Mutex
	held     map[string]string
}

// newOwners returns an empty record; reserved may be nil.
func newOwners(reserved func(clientID string) string) *owners {
	return &owners{reserved: reserved, held: map[string]string{}}
}

// bind gives the record the broker, to see the clients connected (see
// release).
func (o *owners) bind(srv *mqtt.Server) { o.srv = srv }

// claim gives clientID to user, or reports that another user has it:
// the user it is reserved to, or the first user who logged in with it,
// until that user's session ends. Call it once the login is otherwise
// accepted; claims are made under a lock, so two users racing for one ID
// cannot both win.
func (o *owners) claim(user, clientID string) bool {
	if o.reserved != nil {
		if r := o.reserved(clientID); r != "" && r != user {
			return false
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if h, ok := o.held[clientID]; ok && h != user {
		return false
	}
	o.held[clientID] = user
	return true
}

// release ends the hold of cl's user on cl's ID when its session has
// ended, unless a client of that ID is connected again. Call it from
// OnDisconnect when expire is set, and from OnClientExpired.
func (o *owners) release(cl *mqtt.Client) {
	if o.srv != nil {
		if cur, ok := o.srv.Clients.Get(cl.ID); ok && cur != cl && !cur.Closed() {
			return
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.held[cl.ID] == string(cl.Properties.Username) {
		delete(o.held, cl.ID)
	}
}

// namedOwner is a reserved function for newOwners: a client ID that is a user's
// name, or that name, a dot and anything, is that user's (the longest
// such name wins); isUser says which names are users. A device or
// gateway that connects under its own name can then not be squatted.
func namedOwner(isUser func(name string) bool) func(clientID string) string {
	return func(clientID string) string {
		for id := clientID; ; {
			if isUser(id) {
				return id
			}
			i := strings.LastIndexByte(id, '.')
			if i <= 0 {
				return ""
			}
			id = id[:i]
		}
	}
}
