//go:build unix && !linux

package clustertest

import "syscall"

// ProcAttr runs a server, or any child of a test, as cred (nil: as the
// test). Only Linux can have a child die with the test binary: elsewhere
// a timeout's panic may leave one running.
func ProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Credential: cred}
}
