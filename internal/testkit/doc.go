// Package testkit holds the fixtures that tests of every layer share: a
// manual clock (Clock), a bounded wait for a condition or a value
// (Eventually, Receive), a log buffer safe for many writers
// (SyncBuffer) and whether the race detector is on (Race), in the shape
// of net/http/httptest.
//
// It imports only the standard library, so the tests of driver/, which
// imports nothing of ours, can use it too; and only tests import it, so
// its use of package testing never reaches a shipped binary
// (docs/ARCHITECTURE.md).
package testkit
