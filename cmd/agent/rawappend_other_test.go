//go:build !linux

package main

const directFlag = 0
