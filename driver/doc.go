// Package driver is the core of Sortie: the mission model, its state
// machine, and the loop that drives every mission forward one step at a
// time.
//
// A Mission is a durable goal made of ordered Steps. The Driver persists
// every transition through a Store before the side effect that the
// transition allows (write-ahead), executes steps through Handlers
// registered by kind, retries failed steps under a RetryPolicy, waits
// without spending attempts on steps that are not ready, compensates
// completed steps in reverse order when a mission fails or is cancelled
// (saga), and recovers missions left mid-step by a crash through leases.
//
// The package imports none of the other Sortie packages: stores, device
// handlers, scene loaders and the hub implement or consume the small
// interfaces declared here (Store, Handler, Observer, Clock).
package driver
