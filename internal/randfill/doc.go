// Package randfill fills Go values with random data of the kinds missions
// and device messages hold, zero values included, for the tests that
// compare a hand-written JSON encoder with encoding/json. It reaches
// every exported field by reflection, so a field added to a mission later
// is exercised by those tests without their naming it.
//
// Only tests import it. A Filler is not safe for concurrent use (its
// rand.Rand is not).
package randfill
