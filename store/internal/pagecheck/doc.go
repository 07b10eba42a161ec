// Package pagecheck reads a bbolt file's page structure, a page at a
// time and with Go's bounds checks, before bbolt itself reads it through
// a memory map: the meta page in use, the freelist, and every page of
// every bucket's tree, nested buckets included. It refuses what would
// make bbolt read outside the file or a page, visit a page twice, or
// walk an absurd overflow count. bbolt's own checker trusts those, and
// on a damaged file it faults, or spends minutes and gigabytes on one
// bad overflow count (both found by the store's FuzzCheckFile), so a
// backup is checked here first.
//
// It checks structure only, never keys or values: a file that passes
// can still hold records the store cannot decode. The layout is bbolt's
// file format version 2, in the byte order of the machine that wrote
// it: little-endian on every platform this agent ships for.
package pagecheck
