//go:build !linux

package node

import (
	"errors"
	"net"
	"os"
)

var errNoPeerCred = errors.New("node: the cache socket needs linux")

func unixPeer(*net.UnixConn) (peerCred, error) { return peerCred{}, errNoPeerCred }

func heldByThisProcess(*os.File) (bool, error) { return false, errNoPeerCred }
