//go:build race

package testkit

// Race says the race detector is on: tests that run thousands of seeded
// rounds run fewer under it (it slows them five to fifteen times, and
// bounds live goroutines at 8,128), and a run without it does them all.
const Race = true
