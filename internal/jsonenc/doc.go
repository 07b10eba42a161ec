// Package jsonenc appends JSON without reflection, byte for byte what
// encoding/json's Marshal writes for the same value.
//
// Missions, events and device messages are encoded on every step, and on
// a gateway's small core reflection over their maps and times was the
// largest CPU cost of a step. The hand-written encoders that replace it
// (store's mission and event encoders, devices/wire's messages) are built
// from this package's pieces, and each one's tests compare it with
// json.Marshal; this package's own tests do the same for the values and
// strings it writes.
//
// Where a value is not of the shapes written here (a type with its own
// MarshalJSON, a float Marshal writes with an exponent, a year Marshal
// refuses), the encoder asks json.Marshal, so the answer, bytes or
// error, is Marshal's.
//
// An Encoder is not safe for concurrent use; the Append functions are.
package jsonenc
