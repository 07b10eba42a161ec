//go:build race

package fleetsim_test

// raceEnabled says the race detector is on (its limit of live
// goroutines bounds the fleets of the tests).
const raceEnabled = true
